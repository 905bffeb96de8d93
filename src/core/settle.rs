//! Per-item settlement (ack, nack, touch, and the dead-letter requeue): each id is routed
//! by the shard inside it to a local shard worker, or to the host that owns the shard.

use std::collections::{BTreeMap, HashMap};

use futures::future::{join_all, BoxFuture};

use super::access::{denied, Caller, Kind};
use super::host::{check_batch, Host, ShardMap};
use super::in_doubt::{Resolving, LEASE_ENDED};
use super::peers::Forwarded;
use super::validate::{check_duration, limits};
use super::{AckRequestItem, NackRequestItem, TouchRequestItem};
use crate::error::{Error, ErrorCode, Result};
use crate::model::{ItemId, ShardId};
use crate::shard::{AckOp, NackOp, Settled, ShardHandle, TouchOp};

/// Per shard: the positions of a request's items and their keys with their extras.
type Groups<T> = BTreeMap<ShardId, (Vec<usize>, Vec<(u64, T)>)>;

/// Sends the items at these positions of a request to the peer at this address.
pub(super) type Remote<'a> =
    dyn Fn(String, Vec<usize>) -> BoxFuture<'a, Result<Vec<Result<()>>>> + Sync + 'a;

impl Host {
    /// Routes per-item operations to their shards and reassembles replies in request order.
    /// An item whose arguments already failed validation (`Err`) fails alone: it keeps its
    /// position and never reaches a shard. Items of shards owned by another host go to it
    /// through `remote` (their positions in `ids`), or fail with `WRONG_HOST` when there
    /// is no `remote` (forwarding off, or the request was forwarded already). Under access
    /// rules, a local item whose namespace `caller` may not touch for `kind` fails with
    /// `PERMISSION_DENIED` before anything changes; items sent to a peer are checked there.
    pub(super) async fn settle<T: Clone, F, Fut>(
        &self,
        ids: Vec<(String, Result<T>)>,
        (caller, kind): (&Caller, Kind),
        op: F,
        remote: Option<&Remote<'_>>,
    ) -> Vec<Result<()>>
    where
        F: Fn(ShardHandle, Vec<(u64, T)>) -> Fut,
        Fut: std::future::Future<Output = crate::shard::Result<Vec<Settled>>>,
    {
        let shards = self.shards();
        let mut results: Vec<Option<Result<()>>> = vec![None; ids.len()];
        let mut groups: Groups<T> = BTreeMap::new();
        let mut elsewhere: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, (id, extra)) in ids.iter().enumerate() {
            let extra = match extra {
                Ok(x) => x,
                Err(e) => {
                    results[i] = Some(Err(e.clone()));
                    continue;
                }
            };
            let parsed: ItemId = match id.parse() {
                Ok(p) => p,
                Err(e) => {
                    results[i] = Some(Err(e));
                    continue;
                }
            };
            if shards.contains_key(&parsed.shard) {
                let g = groups.entry(parsed.shard).or_default();
                g.0.push(i);
                g.1.push((parsed.key, extra.clone()));
                continue;
            }
            match self
                .cluster
                .owner_for(parsed.shard, remote.is_some(), &format!("item {id}"))
            {
                Ok(addr) => elsewhere.entry(addr).or_default().push(i),
                Err(e) => results[i] = Some(Err(e)),
            }
        }
        self.authorize(&shards, &mut groups, &mut results, caller, kind)
            .await;
        let local = join_all(groups.into_iter().map(|(shard, (positions, keys))| {
            let fut = op(shards[&shard].clone(), keys);
            async move { (positions, fut.await.map_err(Error::from)) }
        }));
        let forwarded = join_all(elsewhere.into_iter().map(|(addr, positions)| async move {
            let remote = remote.expect("only routed elsewhere with a remote");
            let r = remote(addr, positions.clone()).await;
            (positions, r)
        }));
        let (local, forwarded) = futures::join!(local, forwarded);
        for (positions, r) in local {
            for (n, pos) in positions.into_iter().enumerate() {
                results[pos] = Some(match &r {
                    Ok(settled) => match settled[n] {
                        Settled::Done => Ok(()),
                        Settled::NotFound => {
                            Err(Error::not_found(format!("item {} not found", ids[pos].0)))
                        }
                        Settled::LeaseEnded => Err(Error::not_found(format!(
                            "item {}: {LEASE_ENDED} (lease_id is not the item's current delivery)",
                            ids[pos].0
                        ))),
                        Settled::Unapplied => Err(Error::unavailable(format!(
                            "item {}: storage failed and nothing was applied to it; retry",
                            ids[pos].0
                        ))),
                    },
                    Err(e) => Err(e.clone()),
                });
            }
        }
        for (positions, r) in forwarded {
            let n = positions.len();
            for (k, pos) in positions.into_iter().enumerate() {
                results[pos] = Some(match &r {
                    Ok(rs) if rs.len() == n => rs[k].clone(),
                    Ok(_) => Err(Error::new(
                        ErrorCode::Internal,
                        "a peer answered a different number of results",
                    )),
                    Err(e) => Err(e.clone()),
                });
            }
        }
        results
            .into_iter()
            .map(|r| r.expect("every position is filled"))
            .collect()
    }

    /// Takes out of `groups` the items whose namespace `caller` may not touch for `kind`
    /// (their result: `PERMISSION_DENIED`) and the ids with no item (`NOT_FOUND`). An
    /// item's namespace never changes and keys are never reused, so one read beside the
    /// shard's worker decides for the write that follows. Costs nothing when no access
    /// rules are configured.
    async fn authorize<T>(
        &self,
        shards: &ShardMap,
        groups: &mut Groups<T>,
        results: &mut [Option<Result<()>>],
        caller: &Caller,
        kind: Kind,
    ) {
        if self.access.is_open() || self.access.allows(caller, "", Kind::Peer) {
            return;
        }
        let lookups = join_all(groups.iter().map(|(id, (_, keys))| {
            let keys: Vec<u64> = keys.iter().map(|(k, _)| *k).collect();
            let shard = shards[id].clone();
            async move { (*id, shard.lookup(keys).await.map_err(Error::from)) }
        }))
        .await;
        for (id, found) in lookups {
            let group = groups.get_mut(&id).expect("looked up from groups");
            let denied: HashMap<u64, Error> = match found {
                Ok(metas) => {
                    let ns: HashMap<u64, String> =
                        metas.into_iter().map(|m| (m.key, m.ns)).collect();
                    // An id with no item is NOT_FOUND here, not sent on: an item enqueued
                    // under that key after the lookup may be another namespace's.
                    group
                        .1
                        .iter()
                        .filter_map(|(k, _)| match ns.get(k) {
                            None => {
                                Some((*k, Error::not_found(format!("item {id}:{k} not found"))))
                            }
                            Some(n) if !self.access.allows(caller, n, kind) => {
                                Some((*k, denied(caller, n, kind)))
                            }
                            Some(_) => None,
                        })
                        .collect()
                }
                // Cannot tell the namespaces: nothing of this shard may go ahead.
                Err(e) => group.1.iter().map(|(k, _)| (*k, e.clone())).collect(),
            };
            if denied.is_empty() {
                continue;
            }
            let (positions, keys) = std::mem::take(group);
            for (pos, (key, extra)) in positions.into_iter().zip(keys) {
                match denied.get(&key) {
                    Some(e) => results[pos] = Some(Err(e.clone())),
                    None => {
                        group.0.push(pos);
                        group.1.push((key, extra));
                    }
                }
            }
        }
        groups.retain(|_, (positions, _)| !positions.is_empty());
    }

    /// How per-item calls for another host's shards reach it, unless this request was
    /// forwarded already or forwarding is off.
    fn may_forward(&self, forwarded_by: Option<&str>) -> bool {
        forwarded_by.is_none() && self.cluster.settings.forwarding
    }

    /// Who a per-item request acts for (its caller, or the client a peer forwarded it for:
    /// see `Access::acting_for`), and whether this host may forward its items.
    pub(super) fn acting(
        &self,
        caller: &Caller,
        (forwarded_by, forwarded_for): (Option<&str>, Option<&str>),
    ) -> Result<(Caller, bool)> {
        let acting = self
            .access
            .acting_for(caller, forwarded_by, forwarded_for)?;
        Ok((acting, self.may_forward(forwarded_by)))
    }

    /// The identity a call this host routes or forwards for `caller` names for the peer
    /// to check (`forwarded_for`): none for this host's own calls.
    pub(super) fn acting_identity<'a>(&self, caller: &'a Caller) -> Option<&'a str> {
        (!caller.is_trusted()).then_some(caller.identity.as_str())
    }

    /// How this host marks the per-item calls it forwards for `caller`: its own id, and
    /// the identity the owner must check.
    pub(super) fn forwarded_as<'a>(&'a self, caller: &'a Caller) -> Forwarded<'a> {
        // Named even when this host has no rules: the owner's rules may differ.
        Forwarded {
            by: self.host_id(),
            for_identity: self.acting_identity(caller),
        }
    }

    /// Deletes each item, whoever holds it (see [`Host::ack_items`]).
    pub async fn ack(
        &self,
        caller: &Caller,
        ids: Vec<String>,
        forwarded: (Option<&str>, Option<&str>),
    ) -> Result<Vec<Result<()>>> {
        let items = ids
            .into_iter()
            .map(|id| AckRequestItem { id, lease_id: None })
            .collect();
        self.ack_items(caller, items, forwarded).await
    }

    /// Deletes each item; one that names a lease only while it is on that delivery's
    /// lease. Unknown ids: `NOT_FOUND`; an ack repeated within `engine.ack_memory_ms` of
    /// the one that deleted the item (naming the same lease, or none) is done again, not
    /// `NOT_FOUND` (see `shard::AckMemory`). Ids of shards owned by another host are
    /// acked there (see [`Host::settle`]).
    pub async fn ack_items(
        &self,
        caller: &Caller,
        items: Vec<AckRequestItem>,
        forwarded: (Option<&str>, Option<&str>),
    ) -> Result<Vec<Result<()>>> {
        check_batch(items.len(), "ids")?;
        let (caller, may_forward) = self.acting(caller, forwarded)?;
        let mut results = self.ack_once(&caller, &items, may_forward).await;
        // Resolved where the client's call arrived (a forwarded call's doubt goes back to
        // the host that forwarded it, as outcome_unknown).
        if forwarded.0.is_none()
            && results
                .iter()
                .any(|r| r.as_ref().is_err_and(|e| e.in_doubt))
        {
            let caller = &caller;
            self.resolve_in_doubt(Resolving::Ack, &items, &mut results, |sub| {
                Box::pin(async move { self.ack_once(caller, &sub, may_forward).await })
            })
            .await;
        }
        Ok(results)
    }

    /// One pass of [`Host::ack_items`]: each item acked by its shard here, or forwarded.
    pub(super) async fn ack_once(
        &self,
        caller: &Caller,
        items: &[AckRequestItem],
        may_forward: bool,
    ) -> Vec<Result<()>> {
        let from = self.forwarded_as(caller);
        let remote = |addr: String, positions: Vec<usize>| -> BoxFuture<'_, _> {
            let sub = positions.iter().map(|&p| items[p].clone()).collect();
            Box::pin(async move { self.cluster.peers.ack(&addr, sub, from).await })
        };
        let checked = items
            .iter()
            .map(|it| (it.id.clone(), Ok(it.lease_id)))
            .collect();
        let remote: Option<&Remote> = may_forward.then_some(&remote);
        self.settle(
            checked,
            (caller, Kind::Consume),
            |shard, ops| async move {
                let ops = ops
                    .into_iter()
                    .map(|(key, lease_id)| AckOp { key, lease_id })
                    .collect();
                shard.ack(ops).await
            },
            remote,
        )
        .await
    }

    /// Makes each leased item ready again after its delay, with new metadata when given.
    /// One in doubt is resolved before the reply (see `in_doubt`).
    ///
    /// Every nack has a token (see `Host::call_token`), which a row settled by an item
    /// without `lease_id` keeps as its `settled_token`: its retry knows its own work (OK)
    /// and does not settle the item's next delivery. (An item with `lease_id` is known by
    /// its lease.)
    pub async fn nack(
        &self,
        caller: &Caller,
        items: Vec<NackRequestItem>,
        forwarded: (Option<&str>, Option<&str>),
        token: Option<i64>,
    ) -> Result<Vec<Result<()>>> {
        check_batch(items.len(), "items")?;
        let (caller, may_forward) = self.acting(caller, forwarded)?;
        let token = self.call_token(token, forwarded.0)?;
        let mut results = self.nack_once(&caller, &items, may_forward, token).await;
        if forwarded.0.is_none() {
            let caller = &caller;
            self.resolve_in_doubt(Resolving::Nack, &items, &mut results, |sub| {
                Box::pin(async move { self.nack_once(caller, &sub, may_forward, token).await })
            })
            .await;
        }
        Ok(results)
    }

    /// One pass of [`Host::nack`].
    async fn nack_once(
        &self,
        caller: &Caller,
        items: &[NackRequestItem],
        may_forward: bool,
        token: i64,
    ) -> Vec<Result<()>> {
        let from = self.forwarded_as(caller);
        let remote = |addr: String, positions: Vec<usize>| -> BoxFuture<'_, _> {
            let sub = positions.iter().map(|&p| items[p].clone()).collect();
            Box::pin(async move { self.cluster.peers.nack(&addr, sub, from, token).await })
        };
        let remote: Option<&Remote> = may_forward.then_some(&remote);
        let checked = items
            .iter()
            .cloned()
            .map(|it| {
                let delay = it.delay_ms.unwrap_or(0);
                let ok = check_duration("delay_ms", delay).and_then(|()| match &it.metadata {
                    Some(m) if m.len() > limits::METADATA_BYTES_MAX => Err(Error::new(
                        ErrorCode::PayloadTooLarge,
                        format!(
                            "metadata is {} bytes; at most {}",
                            m.len(),
                            limits::METADATA_BYTES_MAX
                        ),
                    )),
                    _ => Ok((delay, it.metadata, it.to_dlq, it.lease_id)),
                });
                (it.id, ok)
            })
            .collect();
        self.settle(
            checked,
            (caller, Kind::Consume),
            |shard, nacks| async move {
                shard
                    .nack(
                        nacks
                            .into_iter()
                            .map(|(key, (delay_ms, metadata, to_dlq, lease_id))| NackOp {
                                key,
                                delay_ms,
                                metadata,
                                to_dlq,
                                lease_id,
                                token: Some(token),
                            })
                            .collect(),
                    )
                    .await
            },
            remote,
        )
        .await
    }

    /// Extends the leases of items still leased to now + `extend_ms`; an item that is not
    /// leased (acked, expired, never delivered) gets `NOT_FOUND`. One in doubt is
    /// resolved before the reply (see `in_doubt`).
    pub async fn touch(
        &self,
        caller: &Caller,
        items: Vec<TouchRequestItem>,
        forwarded: (Option<&str>, Option<&str>),
    ) -> Result<Vec<Result<()>>> {
        check_batch(items.len(), "items")?;
        let (caller, may_forward) = self.acting(caller, forwarded)?;
        let mut results = self.touch_once(&caller, &items, may_forward).await;
        if forwarded.0.is_none() {
            let caller = &caller;
            self.resolve_in_doubt(Resolving::Touch, &items, &mut results, |sub| {
                Box::pin(async move { self.touch_once(caller, &sub, may_forward).await })
            })
            .await;
        }
        Ok(results)
    }

    /// One pass of [`Host::touch`].
    async fn touch_once(
        &self,
        caller: &Caller,
        items: &[TouchRequestItem],
        may_forward: bool,
    ) -> Vec<Result<()>> {
        let from = self.forwarded_as(caller);
        let remote = |addr: String, positions: Vec<usize>| -> BoxFuture<'_, _> {
            let sub = positions.iter().map(|&p| items[p].clone()).collect();
            Box::pin(async move { self.cluster.peers.touch(&addr, sub, from).await })
        };
        let remote: Option<&Remote> = may_forward.then_some(&remote);
        let checked = items
            .iter()
            .cloned()
            .map(|it| {
                let ok =
                    check_duration("extend_ms", it.extend_ms).and_then(|()| match it.extend_ms {
                        0 => Err(Error::invalid("extend_ms must be > 0")),
                        _ => Ok((it.extend_ms, it.lease_id)),
                    });
                (it.id, ok)
            })
            .collect();
        self.settle(
            checked,
            (caller, Kind::Consume),
            |shard, ops| async move {
                let ops = ops
                    .into_iter()
                    .map(|(key, (extend_ms, lease_id))| TouchOp {
                        key,
                        extend_ms,
                        lease_id,
                        in_reply: false,
                    })
                    .collect();
                shard.touch(ops).await
            },
            remote,
        )
        .await
    }
}
