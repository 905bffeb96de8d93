//! The requests and replies of [`super::Host`]'s calls, as the core sees them: what the
//! RPC layer converts the wire types to and from (options unresolved, ids not parsed).

use crate::error::Result;
use crate::model::ItemId;

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
