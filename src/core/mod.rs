//! The queue engine without transport: [`Host`] takes domain requests and returns domain
//! replies. It validates, applies namespace policy, picks shards and merges their heads;
//! it never sees a socket, Thrift or SQL, so it is testable on its own.

mod access;
mod api;
mod cluster;
mod dequeue;
mod enqueue;
mod enqueue_doubt;
mod health;
mod host;
mod in_doubt;
mod inspect;
mod listing;
mod merge;
mod overview;
mod peers;
mod prefetch;
mod replication;
mod routed_dequeue;
mod routing;
mod settle;
mod shard_error;
mod tenants;
mod useful_lease;
mod validate;

pub use access::{denied, not_a_peer, Access, AccessRule, Caller, Hangup, Kind, PeerMark};
pub use api::{
    AckRequestItem, ActiveTopicsPage, EnqueueOutcome, EnqueueRequestItem, NackRequestItem,
    OutcomeAsk, OutcomeState, ShardOutcome, TopicRequest, TouchRequestItem,
};
pub use health::BufferUse;
pub use host::{Host, HostParts, ReplyBounds};
pub use merge::kway_merge;
pub use overview::{NamespaceRow, TopicRow};
pub use peers::{
    ClusterSettings, DeadItem, Forwarded, HostStatus, PeerLoad, PeerStatus, PeerSummary, Peers,
};
pub use prefetch::PrefetchConfig;
pub use validate::limits::ITEM_WIRE_BYTES_MAX;
pub use validate::{check_name, limits, validate_item};
