//! The requests and replies of [`super::Host`]'s calls, as the core sees them: what the
//! RPC layer converts the wire types to and from (options unresolved, ids not parsed).

use crate::error::Result;
use crate::model::{ItemId, ShardId};

/// An enqueued item as the client sent it: options unresolved, policy not yet checked.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EnqueueRequestItem {
    pub ns: String,
    pub topic: String,
    pub priority: i32,
    pub payload: Vec<u8>,
    pub metadata: Option<Vec<u8>>,
    pub deliver_after_ms: Option<i64>,
    pub lease_ms: Option<i64>,
    pub ttl_ms: Option<i64>,
    pub policy: Option<i32>,
    pub max_attempts: Option<i32>,
    pub dedup_key: Option<String>,
}

/// One item's outcome: its id, and whether it was an existing item's (dedup).
pub type EnqueueOutcome = Result<(ItemId, bool)>;

/// One topic of a dequeue request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicRequest {
    pub ns: String,
    pub topic: String,
    pub count: i32,
    /// Only items more urgent than (priority, deliver_after_ms): both or neither, and only
    /// with `local_only` (a host routing a dequeue to its peer sets it).
    pub before: (Option<i32>, Option<i64>),
}

/// One ack as the client sent it (the id not yet parsed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckRequestItem {
    pub id: String,
    /// The delivery this ack answers (`Item.lease_id`); absent: whoever holds the item.
    pub lease_id: Option<i64>,
}

/// One nack as the client sent it (the id not yet parsed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NackRequestItem {
    pub id: String,
    pub delay_ms: Option<i64>,
    pub metadata: Option<Vec<u8>>,
    pub to_dlq: bool,
    /// The delivery this nack answers (`Item.lease_id`); absent: whatever lease it is on.
    pub lease_id: Option<i64>,
}

/// One touch as the client sent it (the id not yet parsed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TouchRequestItem {
    pub id: String,
    pub extend_ms: i64,
    /// The delivery whose lease to extend; absent: whatever lease it is on.
    pub lease_id: Option<i64>,
}

/// One page of `getActiveTopics`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ActiveTopicsPage {
    pub topics: Vec<crate::model::TopicCounts>,
    pub next_after: Option<String>,
}

/// What a host is asked of its shards (`enqueueOutcome`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutcomeAsk {
    /// A forwarded request's token and its number of items.
    Forward { token: i64, items: u32 },
    /// An insert's batch token.
    Batch { token: i64 },
}

/// What one shard says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutcomeState {
    /// Stored (a forwarded request: the items listed, nothing else of it here).
    Committed,
    /// Nothing of it here, and never will be.
    NotCommitted,
    /// Past the shard's memory: the items listed were stored; of the rest nothing is known.
    Forgotten,
    /// Not served by the host asked.
    Unserved,
    /// Not answered (why).
    Error(String),
}

/// One shard's answer to an [`OutcomeAsk`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardOutcome {
    pub shard: ShardId,
    pub state: OutcomeState,
    /// A forwarded request's items stored here: (position, id, deduplicated).
    pub items: Vec<(u32, ItemId, bool)>,
}

impl ShardOutcome {
    pub(super) fn new(shard: ShardId, state: OutcomeState) -> ShardOutcome {
        ShardOutcome {
            shard,
            state,
            items: Vec::new(),
        }
    }

    /// Decided for good (nothing to ask again).
    pub(super) fn decided(&self) -> bool {
        matches!(
            self.state,
            OutcomeState::Committed | OutcomeState::NotCommitted | OutcomeState::Forgotten
        )
    }
}
