//! [`ShardHandle`]: how the host talks to a shard's worker: each call a command on its
//! queue (bounded: a full queue answers busy), each answer awaited within the call's
//! bounds ([`CallBounds`]), and the state the worker publishes for cheap reads.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use super::{
    AckOp, Command, Enqueued, Forward, NackOp, NsSnapshot, ReadyIndex, Result, Resume, Settled,
    ShardError, ShardShared, TouchOp,
};
use crate::model::{
    Head, Item, NewItem, ReadyKey, ReadyTopic, ShardId, ShardState, ShardStatus, TopicCounts,
    TopicName, TopicSnapshot, HEADS_MAX,
};
use crate::store::ItemMeta;

/// An enqueue a shard worker has accepted; resolves when its batch commits or fails.
pub struct PendingEnqueue {
    pub(super) id: ShardId,
    pub(super) rx: oneshot::Receiver<Result<Vec<Enqueued>>>,
    pub(super) bounds: CallBounds,
}

impl PendingEnqueue {
    pub async fn wait(self) -> Result<Vec<Enqueued>> {
        match tokio::time::timeout(self.bounds.reply, self.rx).await {
            Ok(r) => r.map_err(|_| gone(self.id))?,
            Err(_) => Err(no_answer(self.id, self.bounds.reply)),
        }
    }
}

/// How long a request waits for room in a shard's queue, and then for the worker's
/// answer. Every storage operation of the worker has its own timeout, so these are
/// reached only when the worker is stuck (a bug, a blocked thread): the caller then gets
/// a retryable error rather than a hang.
#[derive(Debug, Clone, Copy)]
pub struct CallBounds {
    pub room: std::time::Duration,
    pub reply: std::time::Duration,
}

impl CallBounds {
    /// Room: one store timeout (a turn's writes run together under it). Answer: eight (a
    /// turn may run a refill, the dedup lookups, the writes, dead-letter work one after
    /// another, and a request may wait one turn behind another).
    pub fn for_store_timeout(store_timeout_ms: u64) -> CallBounds {
        let t = std::time::Duration::from_millis(store_timeout_ms.max(1));
        CallBounds {
            room: t,
            reply: t * 8,
        }
    }
}

fn busy(id: ShardId, waited: std::time::Duration) -> ShardError {
    ShardError::Busy {
        shard: id,
        why: format!("its queue stayed full for {} ms", waited.as_millis()),
    }
}

fn no_answer(id: ShardId, waited: std::time::Duration) -> ShardError {
    ShardError::NoAnswer {
        shard: id,
        waited_ms: waited.as_millis() as u64,
    }
}

/// The cloneable sender that talks to one shard's worker.
#[derive(Clone)]
pub struct ShardHandle {
    pub(super) id: ShardId,
    pub(super) tx: mpsc::Sender<Command>,
    pub(super) shared: Arc<ShardShared>,
    /// The worker's ready index, read here so that a peek the index can answer costs no
    /// trip through the worker's queue. Only the worker writes to it (a miss here goes to
    /// the worker).
    pub(super) index: Arc<std::sync::Mutex<ReadyIndex>>,
    /// Keys the index holds per topic, at most (`engine.index_keys_per_topic_max`).
    pub(super) index_cap: usize,
    pub(super) bounds: CallBounds,
}

fn gone(id: ShardId) -> ShardError {
    ShardError::Gone(id)
}

impl ShardHandle {
    pub fn id(&self) -> ShardId {
        self.id
    }

    /// Its worker died (a panic): unhealthy until the shard is reopened with a new one.
    pub fn mark_dead(&self) {
        self.shared.died.store(true, Ordering::Relaxed);
        self.shared.healthy.store(false, Ordering::Relaxed);
    }

    /// The leases of this shard that nobody was handed (staged, or claimed by a claim
    /// whose outcome was unknown): (key, token).
    pub fn unseen_leases(&self) -> Vec<(u64, i64)> {
        self.shared.staged.entries()
    }

    /// The leases of this shard handed out to replies that have not left the host yet
    /// (see [`Staged`]): (key, token).
    pub fn in_reply_leases(&self) -> Vec<(u64, i64)> {
        self.shared.staged.in_reply_entries()
    }

    /// False once its worker has ended (stopped, or died).
    pub fn is_alive(&self) -> bool {
        !self.tx.is_closed()
    }

    /// False while the shard's circuit breaker is open, or after its worker died.
    pub fn is_healthy(&self) -> bool {
        self.shared.healthy.load(Ordering::Relaxed)
    }

    pub fn status(&self) -> ShardStatus {
        let state = if self.shared.died.load(Ordering::Relaxed) {
            ShardState::WorkerDead
        } else if !self.is_alive() {
            ShardState::Stopped
        } else if !self.is_healthy() {
            ShardState::BreakerOpen
        } else {
            ShardState::Serving
        };
        ShardStatus {
            shard: self.id,
            healthy: self.is_healthy(),
            state,
            items: self.shared.items.load(Ordering::Relaxed),
        }
    }

    async fn call<T>(&self, make: impl FnOnce(oneshot::Sender<Result<T>>) -> Command) -> Result<T> {
        let (reply, rx) = oneshot::channel();
        match tokio::time::timeout(self.bounds.room, self.tx.send(make(reply))).await {
            Ok(sent) => sent.map_err(|_| gone(self.id))?,
            Err(_) => return Err(busy(self.id, self.bounds.room)),
        }
        match tokio::time::timeout(self.bounds.reply, rx).await {
            Ok(r) => r.map_err(|_| gone(self.id))?,
            Err(_) => Err(no_answer(self.id, self.bounds.reply)),
        }
    }

    /// Hands `items` to the shard for its next batched INSERT without waiting for room:
    /// an error here means nothing was written, and the items come back with it so the
    /// caller may try elsewhere. Awaiting the returned [`PendingEnqueue`] yields the keys
    /// once the batch committed.
    #[allow(clippy::result_large_err)]
    pub fn submit_enqueue(
        &self,
        items: Vec<NewItem>,
        forward: Option<Forward>,
    ) -> std::result::Result<PendingEnqueue, (Vec<NewItem>, ShardError)> {
        let (reply, rx) = oneshot::channel();
        match self.tx.try_send(Command::Enqueue {
            items,
            forward,
            reply,
        }) {
            Ok(()) => Ok(PendingEnqueue {
                id: self.id,
                rx,
                bounds: self.bounds,
            }),
            Err(e) => {
                let err = match &e {
                    mpsc::error::TrySendError::Full(_) => ShardError::Busy {
                        shard: self.id,
                        why: "its queue is full".into(),
                    },
                    mpsc::error::TrySendError::Closed(_) => gone(self.id),
                };
                let Command::Enqueue { items, .. } = e.into_inner() else {
                    unreachable!("we sent an enqueue")
                };
                Err((items, err))
            }
        }
    }

    /// Commands the worker's queue can still take: how much more this shard can buffer.
    pub fn spare(&self) -> usize {
        self.tx.capacity()
    }

    /// What its ready index holds: (topics, keys, the keys of its fullest topic).
    pub fn index_size(&self) -> (usize, usize, usize) {
        let index = self.index.lock().unwrap_or_else(|p| p.into_inner());
        let (topics, keys) = index.size();
        (topics, keys, index.largest_topic())
    }

    /// Acks its worker remembers now (as of its last turn; see `engine.ack_memory_items_max`).
    pub fn acks_remembered(&self) -> usize {
        self.shared.acks_remembered.load(Ordering::Relaxed)
    }

    /// Sets the nice value (OS priority) its store's threads run at from their next job
    /// (SQLite only: MySQL's work runs in the server).
    pub fn set_nice(&self, nice: i32) {
        if let Some(k) = &self.shared.nice {
            k.store(nice, Ordering::Relaxed);
        }
    }

    /// Commands waiting in the worker's queue.
    pub fn queue_depth(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }

    /// Topics with ready items at `now_ms`, how many, and each one's head as far as the
    /// ready index knows it (see [`crate::model::ReadyTopic`]), from memory.
    pub fn ready_topics(&self, now_ms: i64) -> Vec<ReadyTopic> {
        let counts = self.counts().ready_topics(now_ms);
        let index = self
            .index
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        counts
            .into_iter()
            .map(|(ns, topic, ready)| {
                let topic = TopicName { ns, topic };
                let t = index.get(&topic);
                ReadyTopic {
                    head: t.and_then(|t| t.head_bound()).map(Head::from),
                    // The index holds exactly the ready items up to its watermark, in
                    // order: the rest lie above the last of these.
                    heads: t.map_or_else(Vec::new, |t| {
                        t.head(HEADS_MAX).into_iter().map(Head::from).collect()
                    }),
                    topic,
                    ready,
                }
            })
            .collect()
    }

    /// One topic as [`Self::ready_topics`] shows it, if it has ready items here.
    pub fn ready_topic(&self, topic: &TopicName, now_ms: i64) -> Option<ReadyTopic> {
        let ready = self
            .shared
            .counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .ready_of(&topic.ns, &topic.topic, now_ms);
        if ready <= 0 {
            return None;
        }
        let index = self
            .index
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let t = index.get(topic);
        Some(ReadyTopic {
            topic: topic.clone(),
            ready,
            head: t.and_then(|t| t.head_bound()).map(Head::from),
            heads: t.map_or_else(Vec::new, |t| {
                t.head(HEADS_MAX).into_iter().map(Head::from).collect()
            }),
        })
    }

    /// The shard's items by namespace and state at `now_ms`, from memory.
    pub fn ns_counts(&self, now_ms: i64) -> Vec<(String, NsSnapshot)> {
        self.shared
            .counts
            .lock()
            // Poisoned only by a worker that died holding it: its shard is being reopened,
            // and a reader must not die with it (see `ShardHandle::mark_dead`).
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .snapshot(now_ms)
    }

    /// One namespace's topics on this shard and their counts, from the worker's memory.
    pub fn topic_table(&self, ns: &str, now_ms: i64) -> Vec<(String, NsSnapshot)> {
        self.shared
            .counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .topics(ns, now_ms)
    }

    /// Up to `n` keys of the topic's most urgent ready items at `now_ms`, without leasing
    /// them: from memory when the index holds enough (or everything the counts have
    /// ready), else the worker refills it.
    pub async fn peek(&self, topic: TopicName, n: usize, now_ms: i64) -> Result<Vec<ReadyKey>> {
        let counted =
            self.counts()
                .ready_upto(&topic.ns, &topic.topic, now_ms, self.index_cap as i64 + 1);
        {
            // Read-only: adding a topic here could evict one the worker is refilling.
            // A worker that died holding it poisoned it; its shard is being reopened.
            let index = self
                .index
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(t) = index.get(&topic) {
                if t.len() >= n || (!t.is_partial() && !t.misses_items(counted)) {
                    return Ok(t.head(n));
                }
            }
        }
        self.call(|reply| Command::Peek { topic, n, reply }).await
    }

    /// Leases those of `keys` that are still ready and returns them.
    pub async fn claim(&self, topic: TopicName, keys: Vec<ReadyKey>) -> Result<Vec<Item>> {
        self.call(|reply| Command::Claim { topic, keys, reply })
            .await
    }

    /// Takes the claimed items that may still be handed to a consumer out of the claimed-
    /// not-delivered set, in order, and drops the rest: an ack, nack or expiry settled
    /// them after they were claimed. From here on each returned item is a delivery.
    pub fn hand_out(&self, items: Vec<Item>) -> Vec<Item> {
        self.shared.staged.hand_out(items)
    }

    /// The reply carrying these handed-out deliveries (key, token) left the host: their
    /// leases end by the expiry scan again (see [`Staged`]).
    pub fn replied(&self, leases: impl IntoIterator<Item = (u64, i64)>) {
        self.shared.staged.replied(leases);
    }

    /// Takes handed-out items back, as if never handed out (staged again under their
    /// claim): their reply leaves without them, and [`Self::release`] or the expiry scan
    /// gives them back uncounted. Only those still in reply (see [`Staged::unhand`]).
    pub fn unhand(&self, items: Vec<Item>) -> Vec<Item> {
        self.shared.staged.unhand(items)
    }

    /// Whether this delivery's reply has not left yet, on this worker.
    pub fn is_in_reply(&self, item: &Item) -> bool {
        self.shared
            .staged
            .is_in_reply(item.id.key, item.lease_token)
    }

    /// True while a claimed item is waiting to be handed out under this claim.
    pub fn is_staged(&self, item: &Item) -> bool {
        self.shared.staged.contains(item.id.key, item.lease_token)
    }

    /// Gives back claimed items that were never handed out: ready again, uncounted.
    pub async fn release(&self, items: Vec<Item>) -> Result<()> {
        self.call(|reply| Command::Release { items, reply }).await
    }

    /// Counts, oldest ready item (to the second) and totals of a topic on this shard, from
    /// memory: no query and no turn of the worker. Four clients looping topicStats on a
    /// deep topic once stalled every write of the shard, when the worker counted its rows
    /// in storage in its turn.
    pub async fn topic_snapshot(&self, topic: TopicName, now_ms: i64) -> Result<TopicSnapshot> {
        let totals = self
            .shared
            .totals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&topic)
            .copied()
            .unwrap_or_default();
        let s = self.counts().topic(&topic.ns, &topic.topic, now_ms);
        Ok(TopicSnapshot {
            ready: s.ready,
            deferred: s.deferred,
            leased: s.leased,
            dead: s.dead,
            oldest_ready_ms: s.oldest_ready_ms,
            totals,
        })
    }

    /// The worker's counts (see [`NsCounts`]); poisoned only by a worker that died holding
    /// them: its shard is being reopened, and a reader must not die with it.
    fn counts(&self) -> std::sync::MutexGuard<'_, super::NsCounts> {
        self.shared
            .counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// What the existing items among `keys` are now (namespace, state, ...), read beside
    /// the worker.
    pub async fn lookup(&self, keys: Vec<u64>) -> Result<Vec<ItemMeta>> {
        self.call(|reply| Command::Lookup { keys, reply }).await
    }

    /// Whether the insert of `batch` (see [`ShardError::InsertInDoubt`]) committed,
    /// decided for good (see `store::batches`), asked beside the worker.
    /// When it did, `tally` (its items by topic) is added to the shard's traffic totals.
    pub async fn batch_committed(
        &self,
        batch: i64,
        tally: Vec<(TopicName, i64)>,
    ) -> Result<crate::store::BatchOutcome> {
        self.call(|reply| Command::BatchCommitted {
            batch,
            tally,
            reply,
        })
        .await
    }

    /// What this shard stored of a forwarded request of `items` items under `token`,
    /// decided for good (see `store::forwards`), asked beside the worker.
    pub async fn forward_committed(
        &self,
        token: i64,
        items: u32,
    ) -> Result<crate::store::ForwardOutcome> {
        self.call(|reply| Command::ForwardCommitted {
            token,
            items,
            reply,
        })
        .await
    }

    /// The items among `keys` that are ready, read without leasing them (for peek).
    pub async fn fetch_ready(&self, keys: Vec<u64>) -> Result<Vec<Item>> {
        self.call(|reply| Command::FetchReady { keys, reply }).await
    }

    pub async fn dead_items(
        &self,
        topic: TopicName,
        after: Option<ReadyKey>,
        limit: usize,
    ) -> Result<Vec<(Item, i64)>> {
        self.call(|reply| Command::DeadItems {
            topic,
            after,
            limit,
            reply,
        })
        .await
    }

    /// Requeues the dead items among `keys` (see `ShardWorker::revive`).
    pub async fn revive(&self, keys: Vec<u64>, token: Option<i64>) -> Result<Vec<Settled>> {
        self.call(|reply| Command::Revive { keys, token, reply })
            .await
    }

    pub async fn revive_some(&self, topic: TopicName, limit: usize) -> Result<u64> {
        self.call(|reply| Command::ReviveSome {
            topic,
            limit,
            reply,
        })
        .await
    }

    pub async fn purge_some(&self, topic: TopicName, limit: usize) -> Result<u64> {
        self.call(|reply| Command::PurgeSome {
            topic,
            limit,
            reply,
        })
        .await
    }

    /// Extends the leases of those items that are still leased.
    pub async fn touch(&self, ops: Vec<TouchOp>) -> Result<Vec<Settled>> {
        self.call(|reply| Command::Touch { ops, reply }).await
    }

    pub async fn ack(&self, ops: Vec<AckOp>) -> Result<Vec<Settled>> {
        self.call(|reply| Command::Ack { ops, reply }).await
    }

    pub async fn nack(&self, nacks: Vec<NackOp>) -> Result<Vec<Settled>> {
        self.call(|reply| Command::Nack { nacks, reply }).await
    }

    /// Whether `topic` of `ns` has items on this shard, and how many topics of `ns` do.
    pub fn topics_of(&self, ns: &str, topic: &str) -> (bool, usize) {
        self.counts().topics_of(ns, topic)
    }

    /// The topics of `ns` with items on this shard (see [`NsCounts::active`]), from memory:
    /// listing them costs the shard's worker and storage nothing.
    pub fn topic_counts(
        &self,
        ns: &str,
        after: Option<&str>,
        limit: usize,
        now_ms: i64,
    ) -> Vec<TopicCounts> {
        self.counts().active(ns, after, limit, now_ms)
    }

    /// Asks the worker to flush what it holds, save its checkpoints and stop.
    /// Its storage is gone for good (fenced): its stop writes nothing more to it.
    /// Whether [`Self::abandon`] was called.
    pub fn is_abandoned(&self) -> bool {
        self.shared.abandoned.load(Ordering::Relaxed)
    }

    /// Its server was fenced: nothing more is written there on the way out, and nothing
    /// staged is handed out any more (see `Staged::close`); [`Self::unseen_leases`] then
    /// holds every lease nobody was handed, claims still in flight included.
    pub fn abandon(&self) {
        self.shared.abandoned.store(true, Ordering::Relaxed);
        self.shared.staged.close();
    }

    /// Holds the worker (see [`Command::Hold`]); returns once it has stopped writing,
    /// with the sender that resumes it. `None`: the worker is gone.
    pub async fn hold(&self) -> Option<oneshot::Sender<Resume>> {
        let (held, is_held) = oneshot::channel();
        let (resume_tx, resume) = oneshot::channel();
        self.tx.send(Command::Hold { held, resume }).await.ok()?;
        is_held.await.ok()?;
        Some(resume_tx)
    }

    pub async fn shutdown(&self) {
        let (done, rx) = oneshot::channel();
        if self.tx.send(Command::Shutdown { done }).await.is_ok() {
            let _ = rx.await;
        }
    }
}
