//! Enqueues whose answer was lost, resolved before the reply (see `in_doubt` for acks,
//! nacks and touches).
//!
//! - **An insert in doubt** (the shard's store did not answer in time, or the connection
//!   broke at commit): the shard is asked whether the insert's batch committed, decided
//!   for good (see `store::batches`): committed, the items' ids; not, `UNAVAILABLE`
//!   without doubt ("nothing was stored; retry"). Asked of the worker serving the shard
//!   here now (a new one after a failover) or, when the shard left this host meanwhile,
//!   of the host serving it now (`enqueueOutcome`), every 100 ms until
//!   `ClusterSettings::in_doubt_max`.
//! - **A forwarded enqueue in doubt** (the peer died or went silent mid-call, or answered
//!   in doubt itself): the request carried a token of this host's, under which the peer's
//!   shards marked each item they stored (see `store::forwards`). Every shard of the
//!   items' tiers is asked, through whichever host serves it now (the peer's shards get
//!   a new owner after its death), what it stored under the token, decided for good.
//!   Each item is then: stored on some shard, its id; stored on none, with every shard
//!   decided, `UNAVAILABLE` without doubt; else (a shard not reached by the bound, or past
//!   its memory) still in doubt, as before.
//!
//! Asking every shard of the tier, not only the peer's, is what makes "not stored"
//! certain: the peer may have opened a shard this host did not know it had. It is one
//! call per host serving them, on a path taken only when a peer vanished mid-call.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Instant;

use futures::future::join_all;

use super::access::{Caller, Kind};
use super::api::{EnqueueOutcome, OutcomeAsk, OutcomeState, ShardOutcome};
use super::host::Host;
use crate::error::{Error, Result};
use crate::model::{ItemId, ShardId};
use crate::shard::{Enqueued, ShardError};
use crate::store::BatchOutcome;

/// Between tries: the shard's next owner appears within a poll of the shard manager.
const RETRY_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

impl Host {
    /// Serves `enqueueOutcome`: asks each of `shards` that this host serves now.
    pub async fn enqueue_outcome(
        &self,
        caller: &Caller,
        shards: Vec<ShardId>,
        ask: OutcomeAsk,
    ) -> Result<Vec<ShardOutcome>> {
        self.allow(caller, "", Kind::Peer)?;
        let (token, items) = match ask {
            OutcomeAsk::Forward { token, items } => (token, items as usize),
            OutcomeAsk::Batch { token } => (token, 0),
        };
        // A forwarded request had at most the API's items: each answer writes up to that
        // many tombstones per shard, so more would only be work for nobody.
        if items > super::validate::limits::ITEMS_PER_REQUEST_MAX {
            return Err(Error::invalid(format!(
                "enqueueOutcome: items {items} is more than a request can have ({})",
                super::validate::limits::ITEMS_PER_REQUEST_MAX
            )));
        }
        if crate::store::token_from_the_future(token, self.clock.now_ms()) {
            return Err(Error::invalid(
                "enqueueOutcome: the token was drawn more than a minute ahead of this host's clock",
            ));
        }
        // Each shard is asked once, however often it is named.
        let shards: BTreeSet<ShardId> = shards.into_iter().collect();
        Ok(join_all(shards.into_iter().map(|s| self.local_outcome(s, ask))).await)
    }

    async fn local_outcome(&self, shard: ShardId, ask: OutcomeAsk) -> ShardOutcome {
        let Some(h) = self.shards().get(&shard).cloned() else {
            return ShardOutcome::new(shard, OutcomeState::Unserved);
        };
        match ask {
            OutcomeAsk::Batch { token } => match h.batch_committed(token, Vec::new()).await {
                Ok(BatchOutcome::Committed) => ShardOutcome::new(shard, OutcomeState::Committed),
                Ok(BatchOutcome::NotCommitted) => {
                    ShardOutcome::new(shard, OutcomeState::NotCommitted)
                }
                Ok(BatchOutcome::Forgotten) => ShardOutcome::new(shard, OutcomeState::Forgotten),
                Err(e) => ShardOutcome::new(shard, OutcomeState::Error(e.to_string())),
            },
            OutcomeAsk::Forward { token, items } => match h.forward_committed(token, items).await {
                Ok(o) => ShardOutcome {
                    shard,
                    state: if o.forgotten {
                        OutcomeState::Forgotten
                    } else if o.stored.is_empty() {
                        OutcomeState::NotCommitted
                    } else {
                        OutcomeState::Committed
                    },
                    items: o
                        .stored
                        .into_iter()
                        .map(|(p, key, dup)| (p, ItemId { shard, key }, dup))
                        .collect(),
                },
                Err(e) => ShardOutcome::new(shard, OutcomeState::Error(e.to_string())),
            },
        }
    }

    /// Asks each of `shards` through the host serving it now (this one, or a peer);
    /// a shard without a reachable owner answers `Error`.
    async fn ask_shards(&self, shards: &[ShardId], ask: OutcomeAsk) -> Vec<ShardOutcome> {
        let local = self.shards();
        let mut here = Vec::new();
        let mut by_peer: BTreeMap<String, Vec<ShardId>> = BTreeMap::new();
        let mut out = Vec::new();
        for &s in shards {
            if local.contains_key(&s) {
                here.push(s);
                continue;
            }
            match self.cluster.owner_for(s, true, "an enqueue in doubt") {
                Ok(addr) => by_peer.entry(addr).or_default().push(s),
                Err(e) => out.push(ShardOutcome::new(s, OutcomeState::Error(e.message))),
            }
        }
        let (mine, theirs) = futures::join!(
            join_all(here.into_iter().map(|s| self.local_outcome(s, ask))),
            join_all(by_peer.into_iter().map(|(addr, shards)| async move {
                match self
                    .cluster
                    .peers
                    .enqueue_outcome(&addr, shards.clone(), ask)
                    .await
                {
                    Ok(r) => r,
                    Err(e) => shards
                        .into_iter()
                        .map(|s| ShardOutcome::new(s, OutcomeState::Error(e.message.clone())))
                        .collect(),
                }
            }))
        );
        out.extend(mine);
        out.extend(theirs.into_iter().flatten());
        out
    }

    /// An enqueue's answer from its shard, with an insert in doubt resolved (see the
    /// module's notes).
    pub(super) async fn resolve_enqueue(
        &self,
        r: std::result::Result<Vec<Enqueued>, ShardError>,
    ) -> Result<Vec<Enqueued>> {
        let (shard, batch, planned, tally, first) = match r {
            Ok(keys) => return Ok(keys),
            Err(ShardError::InsertInDoubt {
                shard,
                ref error,
                batch,
                ref planned,
                ref tally,
            }) => (shard, batch, planned.clone(), tally.clone(), error.clone()),
            Err(e) => return Err(e.into()),
        };
        let deadline = Instant::now() + self.cluster.settings.in_doubt_max;
        let unknown = || -> Error {
            ShardError::Storage {
                shard,
                error: first.clone(),
            }
            .into()
        };
        let mut tries = 0u32;
        loop {
            tries += 1;
            // The worker serving the shard here (it adds the items to the shard's totals
            // when they committed), or the shard's new owner when it left this host.
            let answer = match self.shards().get(&shard).cloned() {
                Some(h) => h
                    .batch_committed(batch, tally.clone())
                    .await
                    .map_err(Error::from),
                None => {
                    let ask = OutcomeAsk::Batch { token: batch };
                    let said = self.ask_shards(&[shard], ask).await;
                    match said.into_iter().next().map(|o| o.state) {
                        Some(OutcomeState::Committed) => Ok(BatchOutcome::Committed),
                        Some(OutcomeState::NotCommitted) => Ok(BatchOutcome::NotCommitted),
                        Some(OutcomeState::Forgotten) => Ok(BatchOutcome::Forgotten),
                        Some(OutcomeState::Error(e)) => Err(Error::unavailable(e)),
                        _ => Err(Error::unavailable("not served by its owner yet")),
                    }
                }
            };
            match answer {
                Ok(BatchOutcome::Committed) => {
                    tracing::info!(shard, tries, "an enqueue in doubt had committed");
                    return Ok(planned);
                }
                Ok(BatchOutcome::Forgotten) => {
                    // Past the shard's memory (its clock jumped): unknown, said so.
                    tracing::error!(shard, tries, "an enqueue in doubt whose mark was forgotten: answered UNAVAILABLE, outcome unknown");
                    return Err(unknown());
                }
                Ok(BatchOutcome::NotCommitted) => {
                    tracing::info!(shard, tries, "an enqueue in doubt had not committed");
                    return Err(Error::unavailable(format!(
                        "shard {shard}: storage error: {first}; the insert did not commit \
                         (checked since): nothing was stored; retry"
                    )));
                }
                Err(e) if Instant::now() + RETRY_EVERY >= deadline => {
                    tracing::warn!(
                        shard,
                        tries,
                        last = %e,
                        "an enqueue still in doubt at the bound: answered UNAVAILABLE, outcome unknown"
                    );
                    return Err(unknown());
                }
                Err(_) => tokio::time::sleep(RETRY_EVERY).await,
            }
        }
    }

    /// Resolves the answers in doubt among `results`, a forwarded request's under `token`
    /// (see the module's notes), in place. `tiers`: the items' tiers, whose every shard is
    /// asked. Nothing is looked up when no answer is in doubt (every forward comes here).
    pub(super) async fn resolve_forward(
        &self,
        peer: &str,
        token: i64,
        tiers: &BTreeSet<&str>,
        results: &mut [EnqueueOutcome],
    ) {
        let open: Vec<usize> = (0..results.len())
            .filter(|&i| results[i].as_ref().is_err_and(|e| e.in_doubt))
            .collect();
        if open.is_empty() {
            return;
        }
        let peer_marks = self.cluster.peer_marks_forwards(peer);
        if !peer_marks {
            // An older build (or one never polled): nothing of it can be found.
            tracing::warn!(peer, "a forwarded enqueue in doubt, to a peer that does not say it marks forwarded items: answered UNAVAILABLE, outcome unknown");
            return;
        }
        let shards: BTreeSet<ShardId> = tiers
            .iter()
            .flat_map(|t| self.cluster.tier_shards(t).iter().copied())
            .collect();
        let ask = OutcomeAsk::Forward {
            token,
            items: results.len() as u32,
        };
        let deadline = Instant::now() + self.cluster.settings.in_doubt_max;
        let mut decided: BTreeSet<ShardId> = BTreeSet::new();
        let mut forgotten = false;
        let mut stored: HashMap<u32, (ItemId, bool)> = HashMap::new();
        let mut tries = 0u32;
        let mut last = String::new();
        loop {
            let asked: Vec<ShardId> = shards.difference(&decided).copied().collect();
            if asked.is_empty() || open.iter().all(|&i| stored.contains_key(&(i as u32))) {
                break;
            }
            if tries > 0 {
                if Instant::now() + RETRY_EVERY >= deadline {
                    break;
                }
                tokio::time::sleep(RETRY_EVERY).await;
            }
            tries += 1;
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(said) = tokio::time::timeout(left, self.ask_shards(&asked, ask)).await else {
                break;
            };
            for o in said {
                if o.state == OutcomeState::Forgotten {
                    forgotten = true;
                }
                if let OutcomeState::Error(e) = &o.state {
                    last = format!("shard {}: {e}", o.shard);
                }
                // Only what was asked counts (a peer's stray or garbled entry does not).
                if o.decided() && asked.contains(&o.shard) {
                    decided.insert(o.shard);
                }
                for (p, id, dup) in o.items {
                    stored.insert(p, (id, dup));
                }
            }
        }
        // "Not stored" only when every shard said so, and the peer marks what it stores
        // (an older build does not: its silence proves nothing).
        let all_decided =
            !shards.is_empty() && decided.len() == shards.len() && !forgotten && peer_marks;
        let mut unresolved = 0;
        for i in open {
            if let Some((id, dup)) = stored.get(&(i as u32)) {
                results[i] = Ok((*id, *dup));
            } else if all_decided {
                let first = results[i].as_ref().err().map(|e| e.message.clone());
                let first = first
                    .unwrap_or_default()
                    .replace(crate::error::SENT_OUTCOME_UNKNOWN, "");
                results[i] = Err(Error::unavailable(format!(
                    "{first}; checked since on every shard of its tier: the forwarded \
                     enqueue did not store this item, and never will: nothing was stored; retry"
                )));
            } else {
                unresolved += 1;
            }
        }
        if unresolved == 0 {
            tracing::info!(tries, "a forwarded enqueue in doubt resolved");
        } else {
            tracing::warn!(
                unresolved,
                tries,
                undecided_shards = shards.len() - decided.len(),
                forgotten,
                peer_marks,
                last,
                "a forwarded enqueue still in doubt at the bound: answered UNAVAILABLE, outcome unknown"
            );
        }
    }
}
