//! The queue engine without transport: [`Host`] takes domain requests and returns domain
//! replies. It validates, applies namespace policy, picks shards and merges their heads;
//! it never sees a socket, Thrift or SQL, so it is testable on its own.

mod access;
mod enqueue;
mod health;
mod host;
mod inspect;
mod merge;
mod peers;
mod prefetch;
pub mod quota;
mod routing;
mod settle;
mod validate;

pub use access::{Access, AccessRule, Caller, Kind};
pub use enqueue::EnqueueOutcome;
pub use host::{Host, HostParts};
pub use merge::kway_merge;
pub use peers::{
    ClusterSettings, DeadItem, Forwarded, HostStatus, PeerLoad, PeerStatus, PeerSummary, Peers,
};
pub use prefetch::PrefetchConfig;
pub use validate::{limits, validate_item, EnqueueRequestItem};

/// One topic of a dequeue request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicRequest {
    pub ns: String,
    pub topic: String,
    pub count: i32,
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
