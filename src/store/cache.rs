//! The payload cache: the rows a shard inserted recently, kept in a memory budget
//! (`engine.payload_cache_bytes_max`, one budget for all of a host's shards), so that
//! their first claim need not read them back.
//!
//! On MySQL a claim is an `UPDATE` and then a `SELECT` of the rows it leased (MariaDB has
//! no `UPDATE ... RETURNING`). An item consumed soon after it arrived is still here: its
//! claim is the `UPDATE` alone, and the delivered item is built from what was inserted
//! plus what the claim wrote (`delivery_count` 1, the lease's end and token), which is
//! what the `SELECT` would have read. SQLite's claim reads its rows in the same statement
//! (`RETURNING`), so there is nothing to save and [`Cached`] keeps nothing for it
//! ([`ShardStore::claim_reads_apart`]).
//!
//! An entry is only ever the row as inserted, never claimed: it is dropped on the row's
//! first claim (used or not), and on any other change or deletion of the row, before the
//! change runs (so also when its outcome is unknown); a move on the timer index alone
//! (`Change::Timer`, a deferred item coming due) changes nothing a claim returns and
//! keeps it. A row that was leased, nacked with new metadata, touched, expired or
//! dead-lettered is therefore always read from storage. Entries belong to one [`Cached`]
//! store, that is one worker's life on the shard: a worker that opens the shard later
//! (after another host owned it, or beside an old worker that has not stopped yet) never
//! sees them, and a store drops its own when it closes (each worker start wraps its store
//! in a new [`Cached`], so at an open there are none). Rows handed over at insert (already
//! leased) are not kept. Over budget, the oldest entries go first.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use rustc_hash::FxHashMap;

use super::{Change, Claimed, Handoff, ItemMeta, Recovered, ShardStore, StateCount, StoreResult};
use crate::model::{
    Item, ItemId, NewItem, Policy, ReadyKey, ShardId, TopicCounts, TopicName, Totals,
};

/// What an entry costs beyond its byte fields: its place in the B-tree (nodes partly
/// full), in the map, and the allocator's rounding. Measured: 64 MiB of entries of
/// 100-byte items took about 95 MB of RSS with 160 here, so the budget is close to the
/// memory used with 256.
const ENTRY_OVERHEAD_BYTES: usize = 256;

/// One budget of recently inserted rows, shared by a host's shards.
pub struct PayloadCache {
    bytes_max: usize,
    entries: Mutex<Entries>,
    hits: Counter,
    misses: Counter,
    /// `Entries::bytes`, for the metrics.
    held: Gauge,
}

/// The [`Cached`] store an entry belongs to (each gets its own).
type Owner = u64;

#[derive(Default)]
struct Entries {
    /// Row → its sequence number. Small (no contents), and sized for the budget at the
    /// start: a map that grew by doubling would copy itself into fresh memory each time.
    rows: FxHashMap<(Owner, u64), u64>,
    /// Sequence number (insertion order) → the row's entry, the oldest first. A B-tree
    /// grows a node at a time.
    order: BTreeMap<u64, Entry>,
    bytes: usize,
    next_seq: u64,
}

struct Entry {
    at: (Owner, u64),
    bytes: usize,
    row: Row,
}

/// A row as inserted, its byte fields in one allocation (`ns`, `topic`, `payload`,
/// `metadata`, one after the other): one allocation and one free per entry.
struct Row {
    bytes: Box<[u8]>,
    /// Where `topic`, `payload` and `metadata` start in `bytes`.
    starts: [u32; 3],
    priority: i32,
    deliver_after_ms: i64,
    enqueued_at_ms: i64,
    lease_ms: i64,
    expires_at_ms: Option<i64>,
    policy: Policy,
}

impl Row {
    fn of(it: &NewItem) -> Row {
        let mut bytes =
            Vec::with_capacity(it.ns.len() + it.topic.len() + it.payload.len() + it.metadata.len());
        let mut starts = [0u32; 3];
        bytes.extend_from_slice(it.ns.as_bytes());
        starts[0] = bytes.len() as u32;
        bytes.extend_from_slice(it.topic.as_bytes());
        starts[1] = bytes.len() as u32;
        bytes.extend_from_slice(&it.payload);
        starts[2] = bytes.len() as u32;
        bytes.extend_from_slice(&it.metadata);
        Row {
            bytes: bytes.into_boxed_slice(),
            starts,
            priority: it.priority,
            deliver_after_ms: it.deliver_after_ms,
            enqueued_at_ms: it.enqueued_at_ms,
            lease_ms: it.lease_ms,
            expires_at_ms: it.expires_at_ms,
            policy: it.policy,
        }
    }

    /// The item a claim at `now_ms` under `token` leased: what reading the row back
    /// would return.
    fn claimed(&self, id: ItemId, now_ms: i64, token: i64) -> Item {
        let [t, p, m] = self.starts.map(|s| s as usize);
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        Item {
            id,
            ns: text(&self.bytes[..t]),
            topic: text(&self.bytes[t..p]),
            priority: self.priority,
            payload: self.bytes[p..m].to_vec(),
            metadata: self.bytes[m..].to_vec(),
            deliver_after_ms: self.deliver_after_ms,
            enqueued_at_ms: self.enqueued_at_ms,
            delivery_count: 1,
            lease_expires_ms: now_ms + self.lease_ms,
            lease_ms: self.lease_ms,
            policy: self.policy,
            expires_at_ms: self.expires_at_ms,
            lease_token: token,
        }
    }
}

fn cost(item: &NewItem) -> usize {
    ENTRY_OVERHEAD_BYTES
        + item.payload.len()
        + item.metadata.len()
        + item.ns.len()
        + item.topic.len()
}

/// Entries [`PayloadCache::forget_owner`] looks at per hold of the lock.
const FORGET_CHUNK: usize = 1024;

/// Most rows the map of a cache is sized for at the start.
const ROWS_PRESIZED_MAX: usize = 1 << 20;

impl Entries {
    fn remove(&mut self, at: (Owner, u64)) -> Option<Row> {
        let seq = self.rows.remove(&at)?;
        let e = self.order.remove(&seq)?;
        self.bytes -= e.bytes;
        Some(e.row)
    }
}

impl PayloadCache {
    /// A budget of `bytes_max` (0: nothing is kept).
    pub fn new(bytes_max: usize) -> Arc<PayloadCache> {
        PayloadCache::counted(
            bytes_max,
            Counter::default(),
            Counter::default(),
            Gauge::default(),
        )
    }

    /// [`PayloadCache::new`], counting its hits and misses and showing the bytes it holds
    /// in these (a host's metrics).
    pub fn counted(
        bytes_max: usize,
        hits: Counter,
        misses: Counter,
        held: Gauge,
    ) -> Arc<PayloadCache> {
        Arc::new(PayloadCache {
            bytes_max,
            entries: Mutex::default(),
            hits,
            misses,
            held,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps these rows (inserted ready), evicting the oldest entries to stay within the
    /// budget. A row larger than the whole budget is not kept.
    fn put<'a>(&self, owner: Owner, rows: impl Iterator<Item = (u64, &'a NewItem)>) {
        if self.bytes_max == 0 {
            return;
        }
        // Copied before the lock is taken: the shards' workers share it.
        let fresh: Vec<(u64, usize, Row)> = rows
            .filter_map(|(key, it)| {
                let bytes = cost(it);
                (bytes <= self.bytes_max).then(|| (key, bytes, Row::of(it)))
            })
            .collect();
        let mut e = self.lock();
        if e.rows.capacity() == 0 {
            // Sized at the first row kept, not before: a host whose stores keep nothing
            // (SQLite's) holds no map.
            e.rows
                .reserve((self.bytes_max / ENTRY_OVERHEAD_BYTES).min(ROWS_PRESIZED_MAX));
        }
        for (key, bytes, row) in fresh {
            e.remove((owner, key));
            while e.bytes + bytes > self.bytes_max {
                let Some((_, oldest)) = e.order.pop_first() else {
                    break;
                };
                e.rows.remove(&oldest.at);
                e.bytes -= oldest.bytes;
            }
            let seq = e.next_seq;
            e.next_seq += 1;
            e.rows.insert((owner, key), seq);
            let at = (owner, key);
            e.order.insert(seq, Entry { at, bytes, row });
            e.bytes += bytes;
        }
        self.held.set(e.bytes as i64);
    }

    /// Removes these rows' entries and returns those there were.
    fn take(&self, owner: Owner, keys: &[u64]) -> Vec<(u64, Row)> {
        let mut e = self.lock();
        let found = keys
            .iter()
            .filter_map(|k| e.remove((owner, *k)).map(|i| (*k, i)))
            .collect();
        self.held.set(e.bytes as i64);
        found
    }

    /// Drops these rows' entries.
    fn forget(&self, owner: Owner, keys: impl Iterator<Item = u64>) {
        let mut e = self.lock();
        if e.rows.is_empty() {
            return;
        }
        for k in keys {
            e.remove((owner, k));
        }
        self.held.set(e.bytes as i64);
    }

    /// Drops every entry of one store. The entries are walked oldest first, a chunk per
    /// hold of the lock, so the other shards' workers (which share it) wait for one chunk,
    /// not for a walk of the whole budget (a million entries at the most). The store adds
    /// no entry meanwhile (it is opening or closing), but should one land (a late commit
    /// of the `faults` feature), it is newer than every entry seen and the walk, which runs
    /// to the end, sees it too.
    fn forget_owner(&self, owner: Owner) {
        let mut from = 0;
        loop {
            let mut e = self.lock();
            let chunk: Vec<(u64, (Owner, u64))> = e
                .order
                .range(from..)
                .take(FORGET_CHUNK)
                .map(|(seq, entry)| (*seq, entry.at))
                .collect();
            let Some(&(last, _)) = chunk.last() else {
                break;
            };
            for (_, at) in chunk {
                if at.0 == owner {
                    e.remove(at);
                }
            }
            self.held.set(e.bytes as i64);
            from = last + 1;
        }
    }

    /// Bytes held now (never above the budget).
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// Rows held now.
    pub fn len(&self) -> usize {
        self.lock().rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Claimed rows built from an entry here, and claimed rows read back from storage,
    /// since the start (claims of stores that keep nothing are not counted).
    pub fn hits_misses(&self) -> (u64, u64) {
        (self.hits.get(), self.misses.get())
    }
}

/// A shard's store with the host's payload cache in front of its claims.
pub struct Cached<S> {
    inner: S,
    shard: ShardId,
    owner: Owner,
    /// None when the store's claim reads its rows anyway, or the budget is 0.
    cache: Option<Arc<PayloadCache>>,
    /// Whether this store may have entries in the cache: set when it keeps rows, cleared
    /// when it drops them, so that the close of a store that kept nothing does not walk
    /// the cache.
    kept: AtomicBool,
}

impl<S: ShardStore> Cached<S> {
    pub fn new(inner: S, shard: ShardId, cache: Arc<PayloadCache>) -> Cached<S> {
        let cache = (cache.bytes_max > 0 && inner.claim_reads_apart()).then_some(cache);
        static OWNERS: AtomicU64 = AtomicU64::new(1);
        Cached {
            inner,
            shard,
            owner: OWNERS.fetch_add(1, Ordering::Relaxed),
            cache,
            kept: AtomicBool::new(false),
        }
    }

    fn forget(&self, keys: impl Iterator<Item = u64>) {
        if let Some(c) = &self.cache {
            c.forget(self.owner, keys);
        }
    }
}

/// Operations that neither change rows nor claim them: passed through.
macro_rules! passed {
    ($($name:ident($($arg:ident: $ty:ty),*) -> $out:ty;)*) => {
        $(async fn $name(&self, $($arg: $ty),*) -> StoreResult<$out> {
            self.inner.$name($($arg),*).await
        })*
    };
}

impl<S: ShardStore> ShardStore for Cached<S> {
    passed! {
        ready_keys(ns: &str, topic: &str, after: Option<ReadyKey>, now_ms: i64, limit: usize) -> Vec<ReadyKey>;
        fetch_ready(keys: &[u64], now_ms: i64) -> Vec<Item>;
        dead_items(ns: &str, topic: &str, after: Option<ReadyKey>, limit: usize) -> Vec<(Item, i64)>;
        // Dead rows were claimed once: none is kept here.
        purge_dead(ns: &str, topic: &str, limit: usize) -> u64;
        dedup_lookup(ns: &str, topic: &str, dedup_keys: &[&str]) -> Vec<(String, u64)>;
        lookup(keys: &[u64]) -> Vec<ItemMeta>;
        scan(after: (i64, u64), now_ms: i64, limit: usize) -> Vec<ItemMeta>;
        save_checkpoint(checkpoint_ms: i64) -> ();
        // A batch that did not commit put nothing here.
        batch_committed(batch: i64) -> crate::store::BatchOutcome;
        // Nor did a forwarded request's.
        forward_committed(token: i64, items: u32) -> crate::store::ForwardOutcome;
        forget_batches(before_ms: i64) -> u64;
        topic_counts(ns: &str, after: Option<&str>, now_ms: i64, limit: usize) -> Vec<TopicCounts>;
        totals() -> Vec<(TopicName, Totals)>;
        // Topics holding no item have nothing here.
        forget_topics(topics: &[TopicName]) -> Vec<TopicName>;
        add_totals(deltas: &[(TopicName, Totals)]) -> ();
        state_counts(topic: Option<&TopicName>) -> Vec<StateCount>;
        ping() -> ();
        // A new store (each worker start makes one) has kept nothing.
        open() -> Recovered;
        // The same rows on another server: what is kept stays true.
        retarget(to: &crate::store::Retarget) -> ();
    }

    async fn close(&self) {
        // This store's entries, if it kept any.
        if let Some(c) = &self.cache {
            if self.kept.swap(false, Ordering::Relaxed) {
                c.forget_owner(self.owner);
            }
        }
        self.inner.close().await
    }

    async fn insert(
        &self,
        rows: &[(u64, NewItem)],
        key_high_water: Option<u64>,
        marks: &crate::store::Marks,
        handoff: &Handoff,
        now_ms: i64,
    ) -> StoreResult<()> {
        self.inner
            .insert(rows, key_high_water, marks, handoff, now_ms)
            .await?;
        if let Some(c) = &self.cache {
            self.kept.store(true, Ordering::Relaxed);
            c.put(
                self.owner,
                rows.iter()
                    .filter(|(k, _)| !handoff.holds(*k))
                    .map(|(k, it)| (*k, it)),
            );
        }
        Ok(())
    }

    async fn claim(&self, keys: &[u64], now_ms: i64, token: i64) -> StoreResult<Vec<Item>> {
        let Some(c) = &self.cache else {
            return self.inner.claim(keys, now_ms, token).await;
        };
        let mut cached = c.take(self.owner, keys);
        if cached.is_empty() {
            c.misses.inc_by(keys.len() as u64);
            return self.inner.claim(keys, now_ms, token).await;
        }
        cached.sort_unstable_by_key(|(k, _)| *k);
        let known: Vec<u64> = cached.iter().map(|(k, _)| *k).collect();
        let Claimed {
            mut items,
            known_leased,
        } = self.inner.claim_known(keys, &known, now_ms, token).await?;
        if !known_leased {
            c.misses.inc_by(keys.len() as u64);
            return Ok(items);
        }
        c.hits.inc_by(cached.len() as u64);
        c.misses.inc_by((keys.len() - cached.len()) as u64);
        items.extend(cached.into_iter().map(|(key, row)| {
            let id = ItemId {
                shard: self.shard,
                key,
            };
            row.claimed(id, now_ms, token)
        }));
        Ok(items)
    }

    async fn delete(&self, keys: &[u64]) -> StoreResult<Vec<ItemMeta>> {
        self.forget(keys.iter().copied());
        self.inner.delete(keys).await
    }

    async fn apply(&self, changes: &[Change], now_ms: i64) -> StoreResult<()> {
        // A timer move changes nothing a claim returns (the row's next event is not part
        // of an item): a deferred row that came due keeps its entry.
        let changed = changes
            .iter()
            .filter(|c| !matches!(c, Change::Timer { .. }))
            .map(Change::key);
        self.forget(changed);
        self.inner.apply(changes, now_ms).await
    }

    fn runs_in_order(&self) -> bool {
        self.inner.runs_in_order()
    }

    fn nice_knob(&self) -> Option<crate::store::NiceKnob> {
        self.inner.nice_knob()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(payload_len: usize) -> NewItem {
        NewItem {
            ns: "n".into(),
            topic: "t".into(),
            priority: 1,
            payload: vec![1; payload_len],
            metadata: Vec::new(),
            deliver_after_ms: 0,
            enqueued_at_ms: 0,
            lease_ms: 1_000,
            expires_at_ms: None,
            policy: Policy::AtLeastOnce,
            max_attempts: 0,
            dedup_key: None,
        }
    }

    /// Dropping one store's entries (more than a chunk of them, interleaved with two other
    /// stores', after a gap from evictions and one longer than a chunk from claims) leaves
    /// the others' entries, bytes and gauge exact.
    #[test]
    fn forget_owner_drops_one_stores_entries_and_no_others() {
        let rows = 3 * FORGET_CHUNK as u64 + 100;
        let each = cost(&item(10));
        // Room for all but the first 50 rows of each store: evictions leave a gap.
        let held = Gauge::default();
        let cache = PayloadCache::counted(
            each * (3 * rows as usize - 150),
            Counter::default(),
            Counter::default(),
            held.clone(),
        );
        let it = item(10);
        for key in 0..rows {
            for owner in [1, 2, 3] {
                cache.put(owner, std::iter::once((key, &it)));
            }
        }
        assert_eq!(cache.len(), 3 * rows as usize - 150);
        // A gap longer than a chunk in the middle: every store's rows 1000..1500 claimed.
        let gap: Vec<u64> = (1000..1500).collect();
        for owner in [1, 2, 3] {
            assert_eq!(cache.take(owner, &gap).len(), gap.len());
        }
        cache.forget_owner(2);
        let kept: Vec<u64> = (50..1000).chain(1500..rows).collect();
        assert_eq!(cache.len(), 2 * kept.len());
        assert_eq!(cache.bytes(), each * cache.len());
        assert_eq!(held.get(), cache.bytes() as i64);
        let keys: Vec<u64> = (0..rows).collect();
        assert!(cache.take(2, &keys).is_empty());
        for owner in [1, 3] {
            let got: Vec<u64> = cache
                .take(owner, &keys)
                .into_iter()
                .map(|(k, _)| k)
                .collect();
            assert_eq!(got, kept, "store {owner}");
        }
        assert!(cache.is_empty());
        assert_eq!((cache.bytes(), held.get()), (0, 0));
    }
}
