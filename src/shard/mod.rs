//! Shards: one [`ShardWorker`] task per shard owns everything about it (its buffers, its
//! ready index, its scans, its breaker) and is the only writer of its database. Everyone
//! else talks to it through a [`ShardHandle`], a bounded channel: a full channel is
//! backpressure, answered with a retryable `UNAVAILABLE`, never an unbounded queue.

mod acked;
mod breaker;
mod counts;
mod dlq;
mod doubt;
mod error;
mod exec;
mod forget;
mod handle;
mod handoff;
mod hold;
mod index;
mod inserts;
mod ops;
mod scans;
mod staged;
mod store_call;
mod turn;
mod worker;
mod worker_config;

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize};

use tokio::sync::oneshot;

pub use acked::{AckMemory, Recall};
pub use breaker::Breaker;
pub use counts::{NsCounts, NsSnapshot};
pub use index::{ReadyIndex, TopicIndex};
pub use staged::Staged;
pub use worker::{ShardWorker, READS_BESIDE_MAX};
pub use worker_config::{DlqBounds, WorkerConfig};

use crate::model::{Item, NewItem, ReadyKey, TopicName};
use crate::store::ItemMeta;
pub use error::{Result, ShardError};
pub use handle::{CallBounds, PendingEnqueue, ShardHandle};
pub use hold::Resume;

/// The outcome of one ack or nack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    Done,
    /// No such item (never existed, already acked, purged) or, for a nack, not leased.
    NotFound,
    /// The call named a delivery (`lease_id`) whose lease has ended.
    LeaseEnded,
    /// The storage failed and nothing was applied to this item (others of the same call
    /// were): retry.
    Unapplied,
}

/// Where a worker sends one command's outcome.
pub(crate) type Reply<T> = oneshot::Sender<Result<T>>;

/// One ack for a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckOp {
    pub key: u64,
    /// Only when the item is still on this delivery's lease (or was acked under it, see
    /// [`AckMemory`]); absent: whatever its state.
    pub lease_id: Option<i64>,
}

/// One nack for a worker.
#[derive(Debug, Clone)]
pub struct NackOp {
    pub key: u64,
    pub delay_ms: i64,
    pub metadata: Option<Vec<u8>>,
    /// Straight to the dead letters.
    pub to_dlq: bool,
    /// Only when the item is still on this delivery's lease.
    pub lease_id: Option<i64>,
    /// Without `lease_id`: the nack's token (see `Host::nack`), which the row keeps as
    /// its `settled_token`; a nack finding it there is done (its first try applied).
    pub token: Option<i64>,
}

/// What an enqueued item became: its key, and whether that is the key of an existing
/// item with the same dedup key (nothing was written).
pub type Enqueued = (u64, bool);

/// One touch for a worker: the key and by how long (from now) to extend its lease.
#[derive(Debug, Clone, Copy)]
pub struct TouchOp {
    pub key: u64,
    pub extend_ms: i64,
    /// Only when the item is still on this delivery's lease.
    pub lease_id: Option<i64>,
    /// The host renewing a delivery of its own reply before the reply leaves (see
    /// `core::useful_lease`): done while the row is still on that lease (`lease_id`), even
    /// if its time has passed, since nobody else can hold it until the expiry scan ends
    /// it, and the scan leaves deliveries in reply alone.
    pub in_reply: bool,
}

pub(crate) enum Command {
    Enqueue {
        items: Vec<NewItem>,
        forward: Option<Forward>,
        reply: Reply<Vec<Enqueued>>,
    },
    Peek {
        topic: TopicName,
        n: usize,
        reply: oneshot::Sender<Result<Vec<ReadyKey>>>,
    },
    Claim {
        topic: TopicName,
        keys: Vec<ReadyKey>,
        reply: oneshot::Sender<Result<Vec<Item>>>,
    },
    Ack {
        ops: Vec<AckOp>,
        reply: oneshot::Sender<Result<Vec<Settled>>>,
    },
    Nack {
        nacks: Vec<NackOp>,
        reply: Reply<Vec<Settled>>,
    },
    Release {
        items: Vec<Item>,
        reply: Reply<()>,
    },
    Touch {
        ops: Vec<TouchOp>,
        reply: Reply<Vec<Settled>>,
    },
    FetchReady {
        keys: Vec<u64>,
        reply: Reply<Vec<Item>>,
    },
    Lookup {
        keys: Vec<u64>,
        reply: Reply<Vec<ItemMeta>>,
    },
    BatchCommitted {
        batch: i64,
        tally: Vec<(TopicName, i64)>,
        reply: Reply<crate::store::BatchOutcome>,
    },
    ForwardCommitted {
        token: i64,
        items: u32,
        reply: Reply<crate::store::ForwardOutcome>,
    },
    DeadItems {
        topic: TopicName,
        after: Option<ReadyKey>,
        limit: usize,
        reply: Reply<Vec<(Item, i64)>>,
    },
    /// Dead items (by key) ready again.
    Revive {
        keys: Vec<u64>,
        token: Option<i64>,
        reply: Reply<Vec<Settled>>,
    },
    /// Up to `limit` of a topic's dead items ready again; replies how many.
    ReviveSome {
        topic: TopicName,
        limit: usize,
        reply: Reply<u64>,
    },
    /// Up to `limit` of a topic's dead items deleted; replies how many.
    PurgeSome {
        topic: TopicName,
        limit: usize,
        reply: Reply<u64>,
    },
    Shutdown {
        done: oneshot::Sender<()>,
    },
    /// Stop writing and wait, keeping what the worker knows: a planned switch of the
    /// shard's replica set (see `Host::hold_shard`). The worker writes what it put off,
    /// gives back the leases nobody was handed, saves its checkpoints, says so on `held`,
    /// and runs nothing more until `resume` says where to go on; what reaches it
    /// meanwhile fails as `Gone` (nothing of it applied), and a dropped `resume` stops it
    /// without another write. (A worker started held, `ShardWorker::start_held`, writes
    /// nothing at all before it holds.)
    Hold {
        held: oneshot::Sender<()>,
        resume: oneshot::Receiver<Resume>,
    },
}

/// The items of a forwarded request: the token its forwarding host drew, and where each
/// item sits in the request. The insert marks them under it (see `store::forwards`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forward {
    pub token: i64,
    /// One per item, in the items' order.
    pub positions: Vec<u32>,
}

/// State a worker publishes for cheap reads by the host.
#[derive(Debug)]
pub(crate) struct ShardShared {
    pub healthy: AtomicBool,
    /// Its worker panicked (see [`ShardHandle::mark_dead`]).
    pub died: AtomicBool,
    /// Stopped without writing to its storage (fenced for a failover): the stop gives
    /// nothing back (see `ShardWorker::release_unseen`).
    pub abandoned: AtomicBool,
    pub items: AtomicI64,
    /// Acks its worker remembers (see [`AckMemory`]), as of its last turn.
    pub acks_remembered: AtomicUsize,
    /// The nice value its store's threads run at, when it has threads (SQLite).
    pub nice: Option<crate::store::NiceKnob>,
    /// Claimed items not handed to a consumer yet (see [`Staged`]).
    pub staged: Staged,
    /// Items by namespace and state, kept by the worker (see [`NsCounts`]).
    pub counts: std::sync::Mutex<NsCounts>,
    /// Every topic's traffic totals, saved or not yet: read at open, then moved by the
    /// worker as it counts (see `ShardWorker::tally`), so topicStats needs no query and no
    /// turn of the worker. Lock order: taken alone.
    pub totals: std::sync::Mutex<std::collections::HashMap<TopicName, crate::model::Totals>>,
    /// Items of inserts in doubt since found committed, by topic: the worker adds them to
    /// its traffic totals at its next turn.
    pub late_enqueues: std::sync::Mutex<Vec<(TopicName, i64)>>,
}
