//! The storage side of a turn's nacks, touches and releases: what each runs against the
//! store and decides from what it reads, with no worker state (the worker plans them and
//! `ops.rs` finishes them), so that the worker's loop can run them beside its other writes.

use std::collections::{HashMap, HashSet};

use super::{NackOp, Reply, Settled, TouchOp};
use crate::model::{Item, ItemState, ReadyKey, TopicName};
use crate::store::{Change, ItemMeta, Settle, ShardStore, StoreError, StoreResult};

/// What the nacks of a turn did, per request, and which keys became ready now.
pub(super) struct NackOutcome {
    pub(super) settled: Vec<Vec<Settled>>,
    pub(super) readied: Vec<(String, String, ReadyKey)>,
    /// The topic of every item nacked.
    pub(super) nacked: Vec<(String, String)>,
    /// Where each nacked item went: (ns, topic, state, its deliver_after_ms when ready).
    pub(super) moves: Vec<(String, String, ItemState, i64)>,
}

/// What a turn's acks undo when their DELETE fails: the staged entries they took out
/// (those items are still nobody's), and the topics of claims that dropped keys because
/// they were being acked (those keys left the index and are still ready).
#[derive(Default)]
pub(super) struct AckPlan {
    pub unstaged: Vec<(u64, i64)>,
    pub unclaimed: Vec<TopicName>,
    /// Keys deleted whatever their state (acks that name no lease).
    pub plain: Vec<u64>,
    /// Keys deleted only while leased under the named lease.
    pub named: Vec<(u64, i64)>,
}

/// What a turn's acks did in storage.
pub(super) struct AckOutcome {
    /// The rows deleted.
    pub deleted: Vec<ItemMeta>,
    /// Keys of acks naming a lease whose row exists (on another lease, or not leased).
    pub kept: HashSet<u64>,
}

/// A failed ack DELETE, with the keys found gone when the worker looked again (they were
/// deleted: by this DELETE, whose reply was lost, or committed before the error), or
/// `None` when that look failed too.
pub(super) type AckFailure = (StoreError, Option<HashSet<u64>>);

/// Deletes the acked rows in one statement: every `plain` key, and each `named` key
/// whose row is leased under the named lease (looked up first, only when some ack names
/// one). When the DELETE fails, the worker looks the keys up once more, so that an ack
/// that did commit (its reply lost) is answered as done, not as an error.
pub(super) async fn ack_exec<S: ShardStore>(
    store: &S,
    plan: &AckPlan,
    timeout: std::time::Duration,
) -> Result<AckOutcome, AckFailure> {
    let mut keys = plan.plain.clone();
    let mut kept = HashSet::new();
    if !plan.named.is_empty() {
        let named: Vec<u64> = plan.named.iter().map(|(k, _)| *k).collect();
        // Nothing was written when the look before the DELETE fails: no ack of this turn
        // is applied, and the error says so (not a timeout or a lost connection, which
        // would answer outcome_unknown).
        let nothing = |why: String| {
            Err((
                StoreError::Transient(format!("{why} (before any delete: nothing applied)")),
                Some(HashSet::new()),
            ))
        };
        let found = match tokio::time::timeout(timeout, store.lookup(&named)).await {
            Ok(Ok(found)) => found,
            Ok(Err(e)) => return nothing(e.to_string()),
            Err(_) => return nothing(format!("no answer within {} ms", timeout.as_millis())),
        };
        let rows: HashMap<u64, ItemMeta> = found.into_iter().map(|m| (m.key, m)).collect();
        for (key, lease) in &plan.named {
            match rows.get(key) {
                Some(m) if m.state == ItemState::Leased && m.lease_token == *lease => {
                    keys.push(*key)
                }
                Some(_) => {
                    kept.insert(*key);
                }
                None => {}
            }
        }
    }
    if keys.is_empty() {
        return Ok(AckOutcome {
            deleted: Vec::new(),
            kept,
        });
    }
    let e = match tokio::time::timeout(timeout, store.delete(&keys)).await {
        Ok(Ok(deleted)) => return Ok(AckOutcome { deleted, kept }),
        Ok(Err(e)) => e,
        Err(_) => StoreError::Timeout(timeout.as_millis() as u64),
    };
    // The outcome is unknown: look again. A key still there was not deleted (a DELETE
    // that timed out may yet commit: the worker remembers those acks, see `AckMemory`).
    let gone = match tokio::time::timeout(timeout, store.lookup(&keys)).await {
        Ok(Ok(found)) => {
            let there: HashSet<u64> = found.into_iter().map(|m| m.key).collect();
            Some(
                keys.iter()
                    .copied()
                    .filter(|k| !there.contains(k))
                    .collect(),
            )
        }
        _ => None,
    };
    Err((e, gone))
}

/// A failed nack transaction, with the topics whose rows it may have changed (`None`:
/// unknown, so the whole index is reloaded).
pub(super) type NackFailure = (StoreError, Option<Vec<(String, String)>>);

/// Keeps, of each release, the items still staged under the claim that leased them
/// (taking them out of the staged set); the others were settled since (acked, expired,
/// claimed again) and have nothing to give back.
pub(super) fn plan_releases(
    staged: &super::Staged,
    mut requests: Vec<(Vec<Item>, Reply<()>)>,
) -> Vec<(Vec<Item>, Reply<()>)> {
    for (items, _) in &mut requests {
        items.retain(|i| staged.take(i.id.key, i.lease_token));
    }
    requests
}

pub(super) fn release_changes(requests: &[(Vec<Item>, Reply<()>)]) -> Vec<Change> {
    requests
        .iter()
        .flat_map(|(items, _)| items.iter())
        .map(|i| Change::Release {
            key: i.id.key,
            token: i.lease_token,
        })
        .collect()
}

/// The leases a turn's nacks and touches may not settle: keys acked or being claimed in
/// the turn, and keys staged (claimed, handed to nobody) under the claim that leases the
/// row now. (A key may stay staged under an earlier claim whose outcome was unknown while
/// a later claim's lease was handed out: that consumer's nack is its own.)
pub(super) struct Unheld {
    pub keys: HashSet<u64>,
    pub staged: HashMap<u64, Vec<i64>>,
}

impl Unheld {
    fn holds(&self, key: u64, lease_token: i64) -> bool {
        self.keys.contains(&key)
            || self
                .staged
                .get(&key)
                .is_some_and(|ts| ts.contains(&lease_token))
    }
}

/// The items among `keys` that are leased right now.
async fn leased<S: ShardStore>(store: &S, keys: &[u64]) -> StoreResult<HashMap<u64, ItemMeta>> {
    Ok(store
        .lookup(keys)
        .await?
        .into_iter()
        .filter(|m| m.state == ItemState::Leased)
        .map(|m| (m.key, m))
        .collect())
}

/// Whether a nack or touch may settle `key`'s lease: it must be leased to a consumer
/// (not `unheld`: staged or being claimed), and when the call names a delivery
/// (`lease_id`), on that delivery's lease and before it ran out.
fn held<'a>(
    leased: &'a HashMap<u64, ItemMeta>,
    unheld: &Unheld,
    key: u64,
    lease_id: Option<i64>,
    now: i64,
) -> Result<&'a ItemMeta, Settled> {
    let m = match leased.get(&key) {
        Some(m) if !unheld.holds(key, m.lease_token) => m,
        _ => return Err(Settled::NotFound),
    };
    match lease_id {
        Some(id) if id != m.lease_token || m.lease_expires_ms <= now => Err(Settled::LeaseEnded),
        _ => Ok(m),
    }
}

/// [`held`] for a touch: one `in_reply` (the host renewing a delivery before its reply
/// leaves) needs the row on that lease, not the lease's time left.
fn touchable<'a>(
    leased: &'a HashMap<u64, ItemMeta>,
    unheld: &Unheld,
    op: &TouchOp,
    now: i64,
) -> Result<&'a ItemMeta, Settled> {
    match (op.in_reply, op.lease_id) {
        (true, Some(id)) => match leased.get(&op.key) {
            Some(m) if m.lease_token == id && !unheld.holds(op.key, id) => Ok(m),
            Some(_) => Err(Settled::LeaseEnded),
            None => Err(Settled::NotFound),
        },
        _ => held(leased, unheld, op.key, op.lease_id, now),
    }
}

/// Extends the leases of the touched items that are still leased, in one transaction.
pub(super) async fn touch_exec<S: ShardStore>(
    store: &S,
    requests: &[&[TouchOp]],
    unheld: &Unheld,
    now: i64,
) -> StoreResult<Vec<Vec<Settled>>> {
    let keys: Vec<u64> = requests
        .iter()
        .flat_map(|t| t.iter().map(|op| op.key))
        .collect();
    let leased = leased(store, &keys).await?;
    let mut changes = Vec::new();
    let settled = requests
        .iter()
        .map(|ops| {
            ops.iter()
                .map(|op| {
                    if let Err(s) = touchable(&leased, unheld, op, now) {
                        return s;
                    }
                    changes.push(Change::Extend {
                        key: op.key,
                        lease: leased[&op.key].lease_token,
                        lease_expires_ms: now.saturating_add(op.extend_ms),
                    });
                    Settled::Done
                })
                .collect()
        })
        .collect();
    store.apply(&changes, now).await?;
    Ok(settled)
}

/// Looks the nacked items up, decides each one's fate and applies it in one transaction.
/// A nack settles a lease: an item that is not leased (any more) is `NotFound`; one whose
/// attempts are used up is dead; the rest are ready again at now + delay.
pub(super) async fn nack_exec<S: ShardStore>(
    store: &S,
    requests: &[&[NackOp]],
    unheld: &Unheld,
    now: i64,
) -> Result<NackOutcome, NackFailure> {
    let keys: Vec<u64> = requests
        .iter()
        .flat_map(|n| n.iter().map(|op| op.key))
        .collect();
    let rows: HashMap<u64, ItemMeta> = store
        .lookup(&keys)
        .await
        .map_err(|e| (e, Some(vec![])))?
        .into_iter()
        .map(|m| (m.key, m))
        .collect();
    // A nack whose first try settled the lease (its answer lost): done, whatever became
    // of the item since. Named: the row's settled lease is this one; unnamed: the row
    // keeps this nack's token.
    let already = |key: &u64, lease_id: &Option<i64>, token: &Option<i64>| {
        let settled_by = lease_id.or(*token);
        settled_by.is_some_and(|id| {
            rows.get(key).is_some_and(|m| {
                m.settled_token == id && !(m.state == ItemState::Leased && m.lease_token == id)
            })
        })
    };
    let mut leased: HashMap<u64, ItemMeta> = rows
        .iter()
        .filter(|(_, m)| m.state == ItemState::Leased)
        .map(|(k, m)| (*k, m.clone()))
        .collect();
    let mut changes = Vec::new();
    let mut readied = Vec::new();
    let mut touched = Vec::new();
    let mut moves = Vec::new();
    let mut settled = Vec::with_capacity(requests.len());
    for nacks in requests {
        let mut out = Vec::with_capacity(nacks.len());
        for NackOp {
            key,
            delay_ms,
            metadata,
            to_dlq,
            lease_id,
            token,
        } in nacks.iter()
        {
            if already(key, lease_id, token) {
                out.push(Settled::Done);
                continue;
            }
            // Named, there, not leased: that lease ended (not "not found": the item is
            // not finished, and the resolution of a nack in doubt tells the two apart).
            if lease_id.is_some() && rows.get(key).is_some_and(|m| m.state != ItemState::Leased) {
                out.push(Settled::LeaseEnded);
                continue;
            }
            if let Err(s) = held(&leased, unheld, *key, *lease_id, now) {
                out.push(s);
                continue;
            }
            // `remove`: a second nack of the same key in this turn finds it settled.
            let m = leased.remove(key).expect("held");
            let settle = match (lease_id, token) {
                (None, Some(t)) => Settle::Token(*t),
                _ => Settle::Lease,
            };
            touched.push((m.ns.clone(), m.topic.clone()));
            if *to_dlq || m.delivery_count >= m.max_attempts {
                changes.push(Change::Dead {
                    key: *key,
                    lease: m.lease_token,
                    at_ms: now,
                    settle,
                });
                moves.push((m.ns.clone(), m.topic.clone(), ItemState::Dead, 0));
            } else {
                let deliver_after_ms = now.saturating_add(*delay_ms);
                moves.push((
                    m.ns.clone(),
                    m.topic.clone(),
                    ItemState::Ready,
                    deliver_after_ms,
                ));
                changes.push(Change::Ready {
                    key: *key,
                    lease: m.lease_token,
                    deliver_after_ms: Some(deliver_after_ms),
                    metadata: metadata.clone(),
                    settle,
                });
                if deliver_after_ms <= now {
                    let k = ReadyKey {
                        deliver_after_ms,
                        ..m.ready_key()
                    };
                    readied.push((m.ns, m.topic, k));
                }
            }
            out.push(Settled::Done);
        }
        settled.push(out);
    }
    store
        .apply(&changes, now)
        .await
        .map_err(|e| (e, Some(touched.clone())))?;
    Ok(NackOutcome {
        settled,
        readied,
        nacked: touched,
        moves,
    })
}
