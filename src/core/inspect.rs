//! Reads and dead-letter administration over this host's shards: peek, topic counts
//! and stats, listing, requeueing and purging dead items. None of it leases anything.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use futures::future::join_all;

use super::access::{Caller, Kind};
use super::host::{check_batch, in_range, Host};
use super::in_doubt::Resolving;
use super::settle::Remote;
use super::validate::limits;
use super::{kway_merge, ActiveTopicsPage};
use crate::error::{Error, Result};
use crate::model::{GlobalKey, Item, Progress, ReadyKey, ShardId, TopicCounts, TopicSnapshot};
use crate::shard::ShardHandle;
use futures::future::BoxFuture;

/// A dead-letter page cursor: "priority:deliver_after:key:shard" of the last item shown.
fn parse_cursor(s: &str) -> Result<GlobalKey> {
    let bad = || Error::invalid(format!("malformed cursor {s:?}"));
    let parts: Vec<&str> = s.split(':').collect();
    let [p, d, k, sh] = parts.as_slice() else {
        return Err(bad());
    };
    Ok(GlobalKey {
        priority: p.parse().map_err(|_| bad())?,
        deliver_after_ms: d.parse().map_err(|_| bad())?,
        key: k.parse().map_err(|_| bad())?,
        shard: sh.parse().map_err(|_| bad())?,
    })
}

/// The dead-letter page cursor after `i`: its place in the global order.
pub(super) fn dlq_cursor(i: &Item) -> String {
    let g = i.global_key();
    format!(
        "{}:{}:{}:{}",
        g.priority, g.deliver_after_ms, g.key, g.shard
    )
}

impl Host {
    /// A page of a topic's dead items on this host's shards in delivery order, each with
    /// the time it died, and the cursor of the next page (an opaque string; absent on the
    /// last page).
    pub(super) async fn local_dlq_list(
        &self,
        ns: &str,
        topic: &str,
        limit: Option<i32>,
        after: Option<String>,
    ) -> Result<(Vec<(Item, i64)>, Option<String>)> {
        let topic = self.topic_name(ns, topic)?;
        let limit = in_range(
            "limit",
            limit.unwrap_or(limits::DLQ_PAGE_DEFAULT),
            limits::DLQ_PAGE_MAX,
        )?;
        let cursor = after.as_deref().map(parse_cursor).transpose()?;
        // Each shard's page starts right after the cursor in the global order (ties on
        // (priority, deliver_after, key) go to the lower shard id).
        let shards = self.shards();
        let pages = join_all(shards.values().map(|s| {
            let after = cursor.and_then(|c| {
                if s.id() <= c.shard {
                    Some(ReadyKey {
                        priority: c.priority,
                        deliver_after_ms: c.deliver_after_ms,
                        key: c.key,
                    })
                } else {
                    Some(ReadyKey {
                        priority: c.priority,
                        deliver_after_ms: c.deliver_after_ms,
                        key: c.key.checked_sub(1)?,
                    })
                }
            });
            s.dead_items(topic.clone(), after, limit + 1)
        }))
        .await;
        let mut all = Vec::new();
        for p in pages {
            all.extend(p?);
        }
        all.sort_by_key(|(i, _)| i.global_key());
        let more = all.len() > limit;
        all.truncate(limit);
        let next = if more {
            all.last().map(|(i, _)| dlq_cursor(i))
        } else {
            None
        };
        Ok((all, next))
    }

    /// A topic's counts, totals and the age of its oldest ready item, over this host's
    /// shards.
    pub(super) async fn local_topic_stats(
        &self,
        ns: &str,
        topic: &str,
    ) -> Result<(TopicSnapshot, i64)> {
        let topic = self.topic_name(ns, topic)?;
        let shards = self.shards();
        let (snaps, (staged, staged_oldest)) = beside_stage(
            || self.prefetch.staged_summary(&topic, self.staged_live()),
            || {
                let now = self.clock.now_ms();
                join_all(
                    shards
                        .values()
                        .map(|s| s.topic_snapshot(topic.clone(), now)),
                )
            },
        )
        .await;
        let mut all = TopicSnapshot::default();
        for s in snaps {
            let s = s?;
            all.ready += s.ready;
            all.deferred += s.deferred;
            all.leased += s.leased;
            all.dead += s.dead;
            all.oldest_ready_ms = [all.oldest_ready_ms, s.oldest_ready_ms]
                .into_iter()
                .flatten()
                .min();
            all.totals.add(&s.totals);
        }
        // Staged items are leased rows, but ready as far as clients can tell.
        let staged = staged.min(all.leased);
        all.leased -= staged;
        all.ready += staged;
        all.oldest_ready_ms = [all.oldest_ready_ms, staged_oldest]
            .into_iter()
            .flatten()
            .min();
        let age = all
            .oldest_ready_ms
            .map_or(0, |t| (self.clock.now_ms() - t).max(0));
        Ok((all, age))
    }

    /// Makes dead items ready again with their delivery count reset; an id that is not a
    /// dead item gets `NOT_FOUND`. Ids of shards owned by another host are requeued there
    /// (see [`Host::settle`]).
    ///
    /// Every requeue has a token (see `Host::call_token`), which the rows it makes ready keep as their
    /// `settled_token`. Items whose requeue is in doubt (a store that did not answer, a
    /// peer gone mid-call) are requeued again under the same token until the answer is
    /// certain (see `in_doubt`): an item revived under it is done (OK), one not dead and
    /// not revived under it was not requeued by this call (`NOT_FOUND`).
    pub async fn dlq_requeue(
        &self,
        caller: &Caller,
        ids: Vec<String>,
        forwarded: (Option<&str>, Option<&str>),
        token: Option<i64>,
    ) -> Result<Vec<Result<()>>> {
        check_batch(ids.len(), "ids")?;
        let (caller, may_forward) = self.acting(caller, forwarded)?;
        let token = self.call_token(token, forwarded.0)?;
        let mut results = self
            .dlq_requeue_once(&caller, &ids, may_forward, token)
            .await;
        if forwarded.0.is_none() {
            let caller = &caller;
            self.resolve_in_doubt(Resolving::Requeue, &ids, &mut results, |sub| {
                Box::pin(async move {
                    self.dlq_requeue_once(caller, &sub, may_forward, token)
                        .await
                })
            })
            .await;
        }
        Ok(results)
    }

    /// One pass of [`Host::dlq_requeue`].
    async fn dlq_requeue_once(
        &self,
        caller: &Caller,
        ids: &[String],
        may_forward: bool,
        token: i64,
    ) -> Vec<Result<()>> {
        let from = self.forwarded_as(caller);
        let remote = |addr: String, positions: Vec<usize>| -> BoxFuture<'_, _> {
            let sub = positions.iter().map(|&p| ids[p].clone()).collect();
            Box::pin(async move {
                self.cluster
                    .peers
                    .dlq_requeue(&addr, sub, from, token)
                    .await
            })
        };
        let remote: Option<&Remote> = may_forward.then_some(&remote);
        let checked = ids.iter().map(|id| (id.clone(), Ok(()))).collect();
        self.settle(
            checked,
            (caller, Kind::Admin),
            |shard, keys| async move {
                shard
                    .revive(keys.into_iter().map(|(k, _)| k).collect(), Some(token))
                    .await
            },
            remote,
        )
        .await
    }

    /// Makes up to `max` (default: all) of a topic's dead items ready again, in batches,
    /// until done or `until` (then `more`).
    pub(super) async fn local_dlq_requeue_all(
        &self,
        ns: &str,
        topic: &str,
        max: Option<i64>,
        until: Instant,
    ) -> Result<Progress> {
        let topic = self.topic_name(ns, topic)?;
        let max = max.unwrap_or(i64::MAX);
        if max < 0 {
            return Err(Error::invalid(format!("max must be >= 0, got {max}")));
        }
        let mut done = Progress::default();
        let mut ran = false;
        for shard in self.shards().values() {
            loop {
                let n = (max - done.count).min(limits::DLQ_BATCH as i64) as usize;
                if n == 0 {
                    return Ok(done);
                }
                // At least one batch per call, so that every call makes progress.
                if ran && Instant::now() >= until {
                    done.more = true;
                    return Ok(done);
                }
                ran = true;
                let got = shard.revive_some(topic.clone(), n).await?;
                done.count += got as i64;
                if (got as usize) < n {
                    break;
                }
            }
        }
        Ok(done)
    }

    /// Deletes a topic's dead items, in batches, until none is left or `until` (then
    /// `more`).
    pub(super) async fn local_dlq_purge(
        &self,
        ns: &str,
        topic: &str,
        until: Instant,
    ) -> Result<Progress> {
        let topic = self.topic_name(ns, topic)?;
        let mut done = Progress::default();
        let mut ran = false;
        for shard in self.shards().values() {
            loop {
                if ran && Instant::now() >= until {
                    done.more = true;
                    return Ok(done);
                }
                ran = true;
                let got = shard.purge_some(topic.clone(), limits::DLQ_BATCH).await?;
                done.count += got as i64;
                if got < limits::DLQ_BATCH as u64 {
                    break;
                }
            }
        }
        Ok(done)
    }

    /// The next `count` ready items of a topic in delivery order, without leasing them:
    /// staged items and the shards' index heads, merged.
    pub(super) async fn local_peek(&self, ns: &str, topic: &str, count: i32) -> Result<Vec<Item>> {
        let topic = self.topic_name(ns, topic)?;
        let count = in_range("count", count, limits::DEQUEUE_COUNT_MAX)?;
        // Under the topic's claim lock no claim is in flight, so no item is between the
        // shards' indexes and the stage, invisible to both.
        let lock = self.prefetch.claim_lock(&topic);
        let _claiming = lock.lock().await;
        let mut items = self
            .prefetch
            .peek(&topic, count, self.clock.now_ms(), self.staged_live());
        let shards = self.shards();
        let healthy: Vec<&ShardHandle> = shards.values().filter(|s| s.is_healthy()).collect();
        let heads = join_all(healthy.iter().map(|s| async {
            (
                s.id(),
                s.peek(topic.clone(), count, self.clock.now_ms()).await,
            )
        }))
        .await;
        let heads: Vec<(ShardId, Vec<ReadyKey>)> = heads
            .into_iter()
            .filter_map(|(id, r)| r.ok().map(|k| (id, k)))
            .collect();
        let mut by_shard: HashMap<ShardId, Vec<u64>> = HashMap::new();
        for g in kway_merge(&heads, count) {
            by_shard.entry(g.shard).or_default().push(g.key);
        }
        let fetched = join_all(
            by_shard
                .into_iter()
                .map(|(id, keys)| shards[&id].fetch_ready(keys)),
        )
        .await;
        for r in fetched {
            items.extend(r?);
        }
        items.sort_by_key(Item::global_key);
        items.truncate(count);
        Ok(items)
    }

    /// The namespace's topics holding ready, deferred or leased items on this host's
    /// shards, sorted by name.
    pub(super) async fn local_active_topics(
        &self,
        ns: &str,
        limit: Option<i32>,
        after: Option<String>,
    ) -> Result<ActiveTopicsPage> {
        self.namespace(ns)?;
        let limit = in_range(
            "limit",
            limit.unwrap_or(limits::ACTIVE_TOPICS_LIMIT_DEFAULT),
            limits::ACTIVE_TOPICS_LIMIT_MAX,
        )?;
        // Each shard returns its first limit + 1 topics after the cursor; every topic among
        // the first limit + 1 overall is then in the list of every shard that holds it, so
        // its summed counts are complete.
        let shards = self.shards();
        let (pages, staged) = beside_stage(
            || self.prefetch.staged_counts(ns, self.staged_live()),
            || {
                let now = self.clock.now_ms();
                let pages: Vec<Vec<TopicCounts>> = shards
                    .values()
                    .map(|s| s.topic_counts(ns, after.as_deref(), limit + 1, now))
                    .collect();
                std::future::ready(pages)
            },
        )
        .await;
        let mut merged: BTreeMap<String, TopicCounts> = BTreeMap::new();
        for page in pages {
            for t in page {
                let m = merged
                    .entry(t.topic.clone())
                    .or_insert_with(|| TopicCounts {
                        topic: t.topic.clone(),
                        ..Default::default()
                    });
                m.ready += t.ready;
                m.deferred += t.deferred;
                m.leased += t.leased;
            }
        }
        // Staged items are leased in MySQL but nobody holds them: they count as ready.
        for (topic, n) in staged {
            if let Some(m) = merged.get_mut(&topic) {
                let n = n.min(m.leased);
                m.leased -= n;
                m.ready += n;
            }
        }
        let more = merged.len() > limit;
        let topics: Vec<TopicCounts> = merged.into_values().take(limit).collect();
        let next_after = if more {
            topics.last().map(|t| t.topic.clone())
        } else {
            None
        };
        Ok(ActiveTopicsPage { topics, next_after })
    }
}

/// Reads the shards (`read`) between two reads of the prefetch stage (`stage`), again
/// when the stage moved meanwhile: items claimed into the stage while the shards were
/// read would be counted ready twice (once by their shard, once as staged). A stage that
/// never holds still within three tries is taken as it was last read.
async fn beside_stage<S, T, F>(stage: impl Fn() -> S, read: impl Fn() -> F) -> (T, S)
where
    S: PartialEq,
    F: std::future::Future<Output = T>,
{
    let mut tries = 0;
    loop {
        let before = stage();
        let read = read().await;
        let after = stage();
        tries += 1;
        if after == before || tries == 3 {
            return (read, after);
        }
    }
}
