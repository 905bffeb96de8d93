//! Storage behind a narrow interface: [`ShardStore`] is everything a shard worker asks of
//! its database, one method per operation, each taking `now_ms` explicitly so tests
//! control time inside SQL. [`MySqlStore`] (sharded MySQL/MariaDB) and [`SqliteStore`]
//! (local SQLite files) implement it, with the same layout (schema version 2) and, for
//! writes, the same statements (`sql`).
//!
//! The store trusts its single caller: one [`crate::shard::ShardWorker`] per shard is the
//! only writer, so no method needs locking reads; guards in `WHERE` clauses are safety
//! nets, not concurrency control.

mod batches;
mod cache;
/// Fault injection around a real store, for tests only.
#[cfg(feature = "faults")]
pub mod faulty;
mod fenced;
mod forwards;
mod mysql;
pub mod sql;
mod sqlite;
mod topics;

use std::future::Future;

pub use batches::{new_token as new_batch_token, BatchOutcome, BATCH_MEMORY_MS};
pub use cache::{Cached, PayloadCache};
pub use fenced::Fenced;
pub use forwards::{
    from_the_future as token_from_the_future, too_old as forward_token_too_old, ForwardMark,
    ForwardOutcome, Marks,
};
pub use mysql::{with_tls, MySqlStore, MysqlTls, OnLost};
pub use sqlite::{can_lower_and_restore, sqlite_path, SqliteStore};

use crate::model::{Item, ItemState, NewItem, Policy, ReadyKey, TopicCounts, TopicName, Totals};

/// What went wrong, in the terms the shard needs to decide (no backend's own types): a
/// transient failure, a timeout or a fence are worth retrying elsewhere or later; corrupt
/// data or a schema this build cannot use are not, and become `INTERNAL`.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The storage could not be reached, or refused for now (connection lost, deadlock,
    /// server shutting down): retrying may help.
    #[error("storage unavailable: {0}")]
    Transient(String),
    /// Stored data this build cannot read (an unknown state, a column of the wrong type):
    /// retrying will not help.
    #[error("corrupt or unexpected data: {0}")]
    Corrupt(String),
    /// The shard's schema or location is not one this build can use (a newer version,
    /// another build's table, a bad URL).
    #[error("storage schema: {0}")]
    Schema(String),
    #[error("no answer within {0} ms")]
    Timeout(u64),
    /// The connection failed while a call was in flight (the server died or froze and was
    /// cut off): what was sent may have been applied, as after a timeout.
    #[error("connection lost mid-call (it may have been applied): {0}")]
    Lost(String),
    #[error("this host's ownership of the shard may have lapsed (fenced): it writes no more")]
    Fenced,
    /// Another process holds the shard (its owner lock).
    #[error("{0}")]
    Owned(String),
}

pub type StoreResult<T> = Result<T, StoreError>;

/// (ns, topic, state, second of `deliver_after_ms` for ready items, count).
pub type StateCount = (String, String, ItemState, i64, i64);

/// What a worker needs of an item to decide its next state (ack, nack, expiry, purge).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemMeta {
    pub key: u64,
    pub ns: String,
    pub topic: String,
    pub priority: i32,
    pub deliver_after_ms: i64,
    pub state: ItemState,
    pub delivery_count: i32,
    pub max_attempts: i32,
    pub policy: Policy,
    pub lease_expires_ms: i64,
    pub expires_at_ms: Option<i64>,
    /// The claim that leased it (0 when not leased).
    pub lease_token: i64,
    /// Where the row sits on the timer index (see [`next_event`]).
    pub next_event_ms: Option<i64>,
    /// The lease a consumer's nack or dead-lettering last settled (0: none); lease
    /// expiry and the host's own releases leave it alone.
    pub settled_token: i64,
}

impl ItemMeta {
    pub fn ready_key(&self) -> ReadyKey {
        ReadyKey {
            priority: self.priority,
            deliver_after_ms: self.deliver_after_ms,
            key: self.key,
        }
    }
}

/// What a `Ready` or `Dead` change records in the row's `settled_token`: a consumer's
/// nack remembers what settled the lease, so that its retry (its answer lost) knows its
/// own work; a lease's end records nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Settle {
    /// The lease's end (expiry, release): nothing.
    Not,
    /// A nack naming its lease (`lease_id`): the lease's token.
    Lease,
    /// A nack without `lease_id`: its token (see `Host::nack`; negative, never a lease's).
    Token(i64),
}

/// One row's change, applied with others in one transaction. `Ready`, `Dead` and `Extend`
/// apply only to a row still on the lease they name (`lease`, its claim's token): they
/// settle or extend that lease, and must not touch a row that something else settled
/// first, nor one leased again since (a change whose commit came late, after the row was
/// given back and claimed anew, would otherwise end the new consumer's lease).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A leased row back to ready (or deferred): at `deliver_after_ms` when given, else at
    /// its old place in the order; new metadata when given.
    Ready {
        key: u64,
        lease: i64,
        deliver_after_ms: Option<i64>,
        metadata: Option<Vec<u8>>,
        /// Whether a consumer's nack settles the lease (and what the row's
        /// `settled_token` becomes), or the lease's end (nothing recorded).
        settle: Settle,
    },
    /// A leased row whose attempts are exhausted (or nacked to the dead letters): kept,
    /// never delivered, until requeued or purged.
    Dead {
        key: u64,
        lease: i64,
        at_ms: i64,
        /// As for `Ready`.
        settle: Settle,
    },
    /// A dead row ready again at its old place, its delivery count reset; with a token,
    /// the row's `settled_token` becomes it (a requeue's, see `Host::dlq_requeue`).
    Revive {
        key: u64,
        token: Option<i64>,
    },
    Delete {
        key: u64,
    },
    /// A leased row's lease now ends at `lease_expires_ms` (touch).
    Extend {
        key: u64,
        lease: i64,
        lease_expires_ms: i64,
    },
    /// Moves a row on the timer index only (the scan found its next event still ahead,
    /// or a deferred item came due and its TTL is next), if its timer is still `seen_ms`,
    /// the value the scan read (`None`: whatever it is). The scan's write may land late (a
    /// commit after its caller gave up): by then another write (a lease extended at a
    /// hand-out, a claim, a nack) may have set the row's timer, and a late write that
    /// overwrote it could put the row behind the scan's cursor, never read again.
    Timer {
        key: u64,
        at_ms: Option<i64>,
        seen_ms: Option<i64>,
    },
    /// Undoes a claim whose items were never handed out (staged items let go): ready again
    /// at their old place, the delivery nobody saw not counted. Only the claim that leased
    /// the row (`token`) can release it.
    Release {
        key: u64,
        token: i64,
    },
}

impl Change {
    /// The row it changes.
    pub fn key(&self) -> u64 {
        match self {
            Change::Ready { key, .. }
            | Change::Dead { key, .. }
            | Change::Revive { key, .. }
            | Change::Delete { key }
            | Change::Extend { key, .. }
            | Change::Timer { key, .. }
            | Change::Release { key, .. } => *key,
        }
    }
}

/// The next thing that happens to an item by itself, by its state: a deferred item comes
/// due, a lease ends, a TTL passes. Each row carries the earliest of those that apply
/// (`ItemMeta::next_event_ms`), on one timer index that the background scan reads from a
/// checkpoint. This computes it for a row in `state` at `now_ms`; never before
/// `now_ms + 1`: the scan's cursor may already stand inside `now_ms` (after a full page),
/// and a timer set behind it would never fire.
pub fn next_event(
    state: ItemState,
    deliver_after_ms: i64,
    lease_expires_ms: i64,
    expires_at_ms: Option<i64>,
    now_ms: i64,
) -> Option<i64> {
    let own = match state {
        ItemState::Ready if deliver_after_ms > now_ms => Some(deliver_after_ms),
        ItemState::Leased => Some(lease_expires_ms),
        _ => None,
    };
    let t = match (own, expires_at_ms) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    t.map(|t| t.max(now_ms + 1))
}

/// Rows an insert writes already leased, under one claim token, as a claim would lease
/// them: items handed straight to consumers waiting on their topic (see
/// [`crate::waiters`]), so that they cost no claim (no UPDATE, no read back).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Handoff {
    pub token: i64,
    /// Sorted, so that [`Handoff::holds`] is a binary search.
    pub keys: Vec<u64>,
}

impl Handoff {
    /// Nothing handed: every row is written ready.
    pub const NONE: Handoff = Handoff {
        token: 0,
        keys: Vec::new(),
    };

    pub fn holds(&self, key: u64) -> bool {
        self.keys.binary_search(&key).is_ok()
    }
}

/// What [`ShardStore::claim_known`] leased: the rows it read back, and whether it also
/// leased every row of `known` without reading them (the caller has their contents).
#[derive(Debug, Default)]
pub struct Claimed {
    pub items: Vec<Item>,
    pub known_leased: bool,
}

/// What a shard's store holds at start-up.
#[derive(Debug, Clone, Default)]
pub struct Recovered {
    /// Keys below this were handed out before (perhaps to rows since deleted): never reuse.
    pub key_high_water: u64,
    /// The timer scan's checkpoint: every event up to this millisecond was processed.
    pub checkpoint_ms: i64,
}

/// Where a shard's store moves at a planned switch of its replica set: the same
/// database on another server (see [`ShardStore::retarget`]).
#[derive(Debug, Clone)]
pub struct Retarget {
    pub url: String,
    pub tls: Option<MysqlTls>,
}

/// Everything a shard worker asks of its database.
/// The nice value a store's own threads should run at (see [`ShardStore::nice_knob`]).
pub type NiceKnob = std::sync::Arc<std::sync::atomic::AtomicI32>;

pub trait ShardStore: Send + Sync + 'static {
    /// Creates the schema when missing and reads what the worker needs to resume.
    fn open(&self) -> impl Future<Output = StoreResult<Recovered>> + Send;

    /// Moves the store to the same database on another server, connected once before
    /// it answers: a planned switch of its replica set, whose new primary holds exactly
    /// what the old one held when the shard's worker stopped writing, so that the worker
    /// carries on with what it knows rather than reopening the shard (see
    /// `Host::hold_shard`). A store that cannot move refuses, and its shard is reopened.
    fn retarget(&self, to: &Retarget) -> impl Future<Output = StoreResult<()>> + Send {
        let _ = to;
        async {
            Err(StoreError::Schema(
                "this store does not move to another server".into(),
            ))
        }
    }

    /// Inserts `rows` (their keys chosen by the worker) in one transaction, with `marks`
    /// (the batch's, unless 0, see [`Self::batch_committed`]; forwarded requests' items,
    /// see [`Self::forward_committed`]); when `key_high_water` is given,
    /// persists it in the same transaction. The rows that
    /// `handoff` holds are written leased under its token (delivered once, the lease
    /// ending at `now_ms + lease_ms`), the others ready. Timers are set as of `now_ms`
    /// (see [`next_event`]).
    fn insert(
        &self,
        rows: &[(u64, NewItem)],
        key_high_water: Option<u64>,
        marks: &Marks,
        handoff: &Handoff,
        now_ms: i64,
    ) -> impl Future<Output = StoreResult<()>> + Send;

    /// Whether the insert of `batch` committed, decided for good: a tombstone written now
    /// makes it fail if it has not committed yet (see `batches`); `Forgotten` when its
    /// token is below the forget watermark and its row is gone (no tombstone then).
    fn batch_committed(&self, batch: i64)
        -> impl Future<Output = StoreResult<BatchOutcome>> + Send;

    /// What this shard stored of the forwarded request of `items` items under `token`,
    /// decided for good: tombstones written now for its every position make a late insert
    /// of them fail (see `forwards`); `forgotten` when the token is below the forget
    /// watermark (no tombstones then).
    fn forward_committed(
        &self,
        token: i64,
        items: u32,
    ) -> impl Future<Output = StoreResult<ForwardOutcome>> + Send;

    /// Raises the forget watermark to `before_ms`, then deletes a chunk of batch and
    /// forward marks and tombstones of tokens drawn before it; returns how many.
    fn forget_batches(&self, before_ms: i64) -> impl Future<Output = StoreResult<u64>> + Send;

    /// Up to `limit` keys of ready items of a topic (`deliver_after_ms <= now_ms`), in
    /// ready order, strictly after `after` when given.
    fn ready_keys(
        &self,
        ns: &str,
        topic: &str,
        after: Option<ReadyKey>,
        now_ms: i64,
        limit: usize,
    ) -> impl Future<Output = StoreResult<Vec<ReadyKey>>> + Send;

    /// Leases those of `keys` that are still ready, due and not expired, marking them with
    /// `token`, and returns the items leased.
    fn claim(
        &self,
        keys: &[u64],
        now_ms: i64,
        token: i64,
    ) -> impl Future<Output = StoreResult<Vec<Item>>> + Send;

    /// True when a claim reads its rows back in a statement of its own (MySQL: an `UPDATE`,
    /// then a `SELECT`), which [`claim_known`](Self::claim_known) can skip for rows the
    /// caller already has. SQLite's claim reads them in the same statement (`RETURNING`).
    fn claim_reads_apart(&self) -> bool {
        false
    }

    /// Leases as [`claim`](Self::claim) does; of the rows leased, those in `known`
    /// (sorted) need not be read back: when the store can tell that it leased every one of
    /// `keys`, it reads only the others and sets [`Claimed::known_leased`]. Otherwise
    /// (some key was not leased, or the store reads rows with the claim anyway) every
    /// leased row comes back as an item.
    fn claim_known(
        &self,
        keys: &[u64],
        known: &[u64],
        now_ms: i64,
        token: i64,
    ) -> impl Future<Output = StoreResult<Claimed>> + Send {
        let _ = known;
        async move {
            Ok(Claimed {
                items: self.claim(keys, now_ms, token).await?,
                known_leased: false,
            })
        }
    }

    /// The items among `keys` that are ready (and whose TTL has not passed), unleased.
    fn fetch_ready(
        &self,
        keys: &[u64],
        now_ms: i64,
    ) -> impl Future<Output = StoreResult<Vec<Item>>> + Send;

    /// Up to `limit` dead items of a topic, in ready order strictly after `after`, with
    /// the time each died.
    fn dead_items(
        &self,
        ns: &str,
        topic: &str,
        after: Option<ReadyKey>,
        limit: usize,
    ) -> impl Future<Output = StoreResult<Vec<(Item, i64)>>> + Send;

    /// Deletes up to `limit` dead items of a topic, those dead longest first; returns how
    /// many.
    fn purge_dead(
        &self,
        ns: &str,
        topic: &str,
        limit: usize,
    ) -> impl Future<Output = StoreResult<u64>> + Send;

    /// The existing items of a topic with any of `dedup_keys`: (dedup key, item key).
    fn dedup_lookup(
        &self,
        ns: &str,
        topic: &str,
        dedup_keys: &[&str],
    ) -> impl Future<Output = StoreResult<Vec<(String, u64)>>> + Send;

    /// The current state of those of `keys` that exist.
    fn lookup(&self, keys: &[u64]) -> impl Future<Output = StoreResult<Vec<ItemMeta>>> + Send;

    /// Deletes those of `keys` that exist and returns what they were.
    fn delete(&self, keys: &[u64]) -> impl Future<Output = StoreResult<Vec<ItemMeta>>> + Send;

    /// Applies all `changes` in one transaction; rows changed get their timer (see
    /// [`next_event`]) as of `now_ms`.
    fn apply(
        &self,
        changes: &[Change],
        now_ms: i64,
    ) -> impl Future<Output = StoreResult<()>> + Send;

    /// Up to `limit` rows whose (`next_event_ms`, key) is after `after` and whose
    /// `next_event_ms` is at most `now_ms`, in that order: one index range read.
    fn scan(
        &self,
        after: (i64, u64),
        now_ms: i64,
        limit: usize,
    ) -> impl Future<Output = StoreResult<Vec<ItemMeta>>> + Send;

    /// Persists the timer scan's checkpoint.
    fn save_checkpoint(&self, checkpoint_ms: i64) -> impl Future<Output = StoreResult<()>> + Send;

    /// Topics of `ns` after `after` (bytewise) holding ready, deferred or leased items,
    /// sorted by name, at most `limit`.
    fn topic_counts(
        &self,
        ns: &str,
        after: Option<&str>,
        now_ms: i64,
        limit: usize,
    ) -> impl Future<Output = StoreResult<Vec<TopicCounts>>> + Send;

    /// Every topic's saved traffic totals, read when the shard opens (the worker keeps
    /// them in memory from then on, as it does the counts).
    fn totals(&self) -> impl Future<Output = StoreResult<Vec<(TopicName, Totals)>>> + Send;

    /// Forgets those of `topics` that hold no item on this shard: their rows, totals and
    /// ids (see `topics::TopicIds::begin_forgetting`). Returns the ones forgotten. Called by the
    /// worker, the shard's only writer, with no write of its in doubt.
    fn forget_topics(
        &self,
        topics: &[TopicName],
    ) -> impl Future<Output = StoreResult<Vec<TopicName>>> + Send;

    /// Adds to the saved totals of each topic, in one statement.
    fn add_totals(
        &self,
        deltas: &[(TopicName, Totals)],
    ) -> impl Future<Output = StoreResult<()>> + Send;

    /// How many items there are by topic and state, and for ready items by the second of
    /// their `deliver_after_ms`: (ns, topic, state, second, count), of every topic or of
    /// `topic` only. Read when the shard opens (the worker keeps the counts from then on),
    /// and for a topic again once a write's unknown outcome has settled.
    fn state_counts(
        &self,
        topic: Option<&TopicName>,
    ) -> impl Future<Output = StoreResult<Vec<StateCount>>> + Send;

    /// A cheap round trip, used to probe a shard whose breaker is open.
    fn ping(&self) -> impl Future<Output = StoreResult<()>> + Send;

    /// Lets the shard go (its owner lock, when the store takes one); called once, when
    /// the worker stops.
    fn close(&self) -> impl Future<Output = ()> + Send;

    /// True when the store runs its writes one after another in the order they were
    /// called, a write whose caller gave up included (SQLite's one thread): then an
    /// operation answered has every earlier one behind it. MySQL's connections run
    /// statements side by side.
    fn runs_in_order(&self) -> bool {
        false
    }

    /// The nice value (OS priority) the store's own threads should run at, when it runs
    /// its work on threads of its own (SQLite); `None` otherwise (MySQL's work runs in
    /// its server). The host sets it (see `core::tenants`).
    fn nice_knob(&self) -> Option<NiceKnob> {
        None
    }
}
