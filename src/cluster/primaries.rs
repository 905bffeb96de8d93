//! The replicated shards' records in etcd, under the cluster's prefix P:
//! - `P/primaries/<shard>` = [`PrimaryRecord`] (no lease): the current primary, its
//!   generation and whether it is being switched;
//! - `P/paused/<shard>` and `P/served/<shard>` = [`Ack`], under the owner's lease: the
//!   owner paused the shard for a switch, or serves it on the primary of a generation;
//! - `P/switching/<servers>` = the driving host, under a lease of the driver's: one switch
//!   of a replica set at a time;
//! - `P/switch/<servers>` = the journal of a switch under way (no lease): where it got
//!   to, so that the next driver finishes or undoes it (`crate::replication::journal`);
//! - `P/demoted/<server>` = [`Demoted`] (no lease): a primary that was failed over while it
//!   did not answer, to be made read-only and repointed when it answers again.

use std::collections::BTreeMap;

use etcd_client::{
    Client, Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use serde::{Deserialize, Serialize};

use crate::model::{PrimaryRecord, ShardId};

pub type EtcdResult<T> = Result<T, etcd_client::Error>;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    pub generation: u64,
    pub host: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Demoted {
    /// The primary that replaced it.
    pub primary: String,
    pub generation: u64,
}

pub fn key(prefix: &str, dir: &str, name: impl std::fmt::Display) -> String {
    format!("{}/{dir}/{name}", prefix.trim_end_matches('/'))
}

/// Creates the records of shards that have none (the config's initial layout); returns
/// the revision that shows every record (see [`seen_after`]).
pub async fn init(
    client: &mut Client,
    prefix: &str,
    initial: &BTreeMap<ShardId, PrimaryRecord>,
) -> EtcdResult<i64> {
    let mut seen = 0;
    for (s, r) in initial {
        let k = key(prefix, "primaries", s);
        let txn = Txn::new()
            .when([Compare::create_revision(k.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                k.clone(),
                serde_json::to_vec(r).expect("serializable"),
                None,
            )])
            .or_else([TxnOp::get(k, None)]);
        seen = seen.max(seen_after(&client.txn(txn).await?));
    }
    Ok(seen)
}

/// Every key under `P/<dir>/`, each as `f(its last path segment, value, mod revision)`
/// (keys `f` cannot read are left out).
async fn scan<T>(
    client: &mut Client,
    prefix: &str,
    dir: &str,
    f: impl Fn(&str, &[u8], i64) -> Option<T>,
) -> EtcdResult<Vec<T>> {
    let resp = client
        .get(key(prefix, dir, ""), Some(GetOptions::new().with_prefix()))
        .await?;
    Ok(resp
        .kvs()
        .iter()
        .filter_map(|kv| {
            let name = kv.key_str().ok()?.rsplit('/').next()?;
            f(name, kv.value(), kv.mod_revision())
        })
        .collect())
}

/// Every record of `dir` by shard, with its mod revision.
pub async fn read<T: for<'de> Deserialize<'de>>(
    client: &mut Client,
    prefix: &str,
    dir: &str,
) -> EtcdResult<BTreeMap<ShardId, (T, i64)>> {
    let all = scan(client, prefix, dir, |name, value, rev| {
        Some((
            name.parse().ok()?,
            (serde_json::from_slice(value).ok()?, rev),
        ))
    })
    .await?;
    Ok(all.into_iter().collect())
}

/// Writes `records` in one transaction, if every one is still at the revision read and
/// `held` holds (the driver's switch lock); `also` in the same transaction.
pub async fn publish(
    client: &mut Client,
    prefix: &str,
    records: &[(ShardId, PrimaryRecord, i64)],
    (held, also): (Compare, Vec<TxnOp>),
) -> EtcdResult<bool> {
    let when: Vec<Compare> = records
        .iter()
        .map(|(s, _, rev)| {
            Compare::mod_revision(key(prefix, "primaries", s), CompareOp::Equal, *rev)
        })
        .chain(std::iter::once(held))
        .collect();
    let then: Vec<TxnOp> = records
        .iter()
        .map(|(s, r, _)| {
            TxnOp::put(
                key(prefix, "primaries", s),
                serde_json::to_vec(r).expect("serializable"),
                None,
            )
        })
        .chain(also)
        .collect();
    Ok(client
        .txn(Txn::new().when(when).and_then(then))
        .await?
        .succeeded())
}

/// Puts an ack under `lease`.
pub async fn ack(
    client: &mut Client,
    prefix: &str,
    dir: &str,
    shard: ShardId,
    a: &Ack,
    lease: i64,
) -> EtcdResult<()> {
    client
        .put(
            key(prefix, dir, shard),
            serde_json::to_vec(a).expect("serializable"),
            Some(PutOptions::new().with_lease(lease)),
        )
        .await?;
    Ok(())
}

/// Takes `P/switching/<name>` under a lease of its own (`ttl_s`); the lease id, or None
/// when another host holds it.
pub async fn lock(
    client: &mut Client,
    prefix: &str,
    name: &str,
    holder: &str,
    ttl_s: i64,
) -> EtcdResult<Option<i64>> {
    let lease = client.lease_grant(ttl_s, None).await?.id();
    let k = key(prefix, "switching", name);
    let txn = Txn::new()
        .when([Compare::create_revision(k.clone(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            k,
            holder,
            Some(PutOptions::new().with_lease(lease)),
        )]);
    if client.txn(txn).await?.succeeded() {
        Ok(Some(lease))
    } else {
        let _ = client.lease_revoke(lease).await;
        Ok(None)
    }
}

/// That the lock `lock_key` is still held under `lease`, for a transaction's guard.
pub fn held(lock_key: &str, lease: i64) -> Compare {
    Compare::lease(lock_key, CompareOp::Equal, lease)
}

/// Deletes `k` if the lock `lock_key` is still held under `lease`.
pub async fn delete_if_locked(
    client: &mut Client,
    k: String,
    (lock_key, lease): (&str, i64),
) -> EtcdResult<bool> {
    let txn = Txn::new()
        .when([held(lock_key, lease)])
        .and_then([TxnOp::delete(k, None)]);
    Ok(client.txn(txn).await?.succeeded())
}

/// Puts `value` at `k` if the lock `lock_key` is still held under `lease`.
pub async fn put_if_locked(
    client: &mut Client,
    k: String,
    value: Vec<u8>,
    (lock_key, lease): (&str, i64),
) -> EtcdResult<bool> {
    let txn = Txn::new()
        .when([Compare::lease(lock_key, CompareOp::Equal, lease)])
        .and_then([TxnOp::put(k, value, None)]);
    Ok(client.txn(txn).await?.succeeded())
}

/// The value at `k`, if any.
pub async fn get(client: &mut Client, k: &str) -> EtcdResult<Option<Vec<u8>>> {
    let resp = client.get(k, None).await?;
    Ok(resp.kvs().first().map(|kv| kv.value().to_vec()))
}

pub async fn unlock(client: &mut Client, lease: i64) {
    let _ = client.lease_revoke(lease).await;
}

pub async fn put_demoted(
    client: &mut Client,
    prefix: &str,
    server: &str,
    d: &Demoted,
) -> EtcdResult<()> {
    client
        .put(
            key(prefix, "demoted", server),
            serde_json::to_vec(d).expect("serializable"),
            None,
        )
        .await?;
    Ok(())
}

pub async fn demoted(client: &mut Client, prefix: &str) -> EtcdResult<Vec<(String, Demoted)>> {
    scan(client, prefix, "demoted", |name, value, _| {
        Some((name.to_string(), serde_json::from_slice(value).ok()?))
    })
    .await
}

pub async fn clear_demoted(client: &mut Client, prefix: &str, server: &str) -> EtcdResult<()> {
    client.delete(key(prefix, "demoted", server), None).await?;
    Ok(())
}

/// Each shard's owner key (`P/shards/<shard>` = host id).
pub async fn read_owners(
    client: &mut Client,
    prefix: &str,
) -> EtcdResult<BTreeMap<ShardId, String>> {
    let all = scan(client, prefix, "shards", |name, value, _| {
        Some((name.parse().ok()?, String::from_utf8(value.to_vec()).ok()?))
    })
    .await?;
    Ok(all.into_iter().collect())
}

/// The revision the cache must reach to show what `r` did or found: a write's own
/// revision when the transaction took its `then` branch, else the revision of the key its
/// `else` branch read (0 when it read none: nothing to wait for).
pub fn seen_after(r: &TxnResponse) -> i64 {
    if r.succeeded() {
        return r.header().map_or(0, |h| h.revision());
    }
    r.op_responses()
        .iter()
        .filter_map(|op| match op {
            TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.mod_revision()),
            _ => None,
        })
        .max()
        .unwrap_or(0)
}
