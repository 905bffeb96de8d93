//! [`Fenced`]: any [`ShardStore`], refusing every operation while this host's [`Fence`]
//! is closed (its ownership of the shard may have lapsed, see [`crate::fence`]). Fencing
//! is the most safety-critical check of a cluster, so it lives here, above the seam, once
//! for every backend, rather than in each store.

use super::{
    Change, Handoff, ItemMeta, Recovered, ShardStore, StateCount, StoreError, StoreResult,
};
use crate::fence::Fence;
use crate::model::{Item, NewItem, ReadyKey, TopicCounts, TopicName, Totals};

pub struct Fenced<S> {
    inner: S,
    fence: Fence,
}

impl<S: ShardStore> Fenced<S> {
    pub fn new(inner: S, fence: Fence) -> Fenced<S> {
        Fenced { inner, fence }
    }

    fn check(&self) -> StoreResult<()> {
        if self.fence.is_open() {
            Ok(())
        } else {
            Err(StoreError::Fenced)
        }
    }
}

/// Each operation: the fence first, then the store.
macro_rules! fenced {
    ($($name:ident($($arg:ident: $ty:ty),*) -> $out:ty;)*) => {
        impl<S: ShardStore> ShardStore for Fenced<S> {
            $(async fn $name(&self, $($arg: $ty),*) -> StoreResult<$out> {
                self.check()?;
                self.inner.$name($($arg),*).await
            })*

            async fn close(&self) {
                // Letting go is always allowed.
                self.inner.close().await
            }

            fn runs_in_order(&self) -> bool {
                self.inner.runs_in_order()
            }

            fn nice_knob(&self) -> Option<crate::store::NiceKnob> {
                self.inner.nice_knob()
            }
        }
    };
}

fenced! {
    open() -> Recovered;
    retarget(to: &crate::store::Retarget) -> ();
    insert(rows: &[(u64, NewItem)], key_high_water: Option<u64>, marks: &crate::store::Marks, handoff: &Handoff, now_ms: i64) -> ();
    ready_keys(ns: &str, topic: &str, after: Option<ReadyKey>, now_ms: i64, limit: usize) -> Vec<ReadyKey>;
    claim(keys: &[u64], now_ms: i64, token: i64) -> Vec<Item>;
    fetch_ready(keys: &[u64], now_ms: i64) -> Vec<Item>;
    dead_items(ns: &str, topic: &str, after: Option<ReadyKey>, limit: usize) -> Vec<(Item, i64)>;
    purge_dead(ns: &str, topic: &str, limit: usize) -> u64;
    dedup_lookup(ns: &str, topic: &str, dedup_keys: &[&str]) -> Vec<(String, u64)>;
    lookup(keys: &[u64]) -> Vec<ItemMeta>;
    delete(keys: &[u64]) -> Vec<ItemMeta>;
    apply(changes: &[Change], now_ms: i64) -> ();
    scan(after: (i64, u64), now_ms: i64, limit: usize) -> Vec<ItemMeta>;
    save_checkpoint(checkpoint_ms: i64) -> ();
    batch_committed(batch: i64) -> crate::store::BatchOutcome;
    forward_committed(token: i64, items: u32) -> crate::store::ForwardOutcome;
    forget_batches(before_ms: i64) -> u64;
    topic_counts(ns: &str, after: Option<&str>, now_ms: i64, limit: usize) -> Vec<TopicCounts>;
    totals() -> Vec<(TopicName, Totals)>;
    forget_topics(topics: &[TopicName]) -> Vec<TopicName>;
    add_totals(deltas: &[(TopicName, Totals)]) -> ();
    state_counts(topic: Option<&TopicName>) -> Vec<StateCount>;
    ping() -> ();
}
