//! Conversions between the generated Thrift types and the domain types, in one place.
//! Absent fields of the generated structs (all are `Option`) become the domain's defaults:
//! an absent string is empty (and then fails validation), an absent number is 0.

use crate::core::{
    AckRequestItem, ActiveTopicsPage, EnqueueRequestItem, HostStatus, NackRequestItem, OutcomeAsk,
    OutcomeState, ShardOutcome, TopicRequest, TouchRequestItem,
};
use crate::error::{Error, ErrorCode, Result};
use crate::model::{
    Head, Item, ItemId, Policy, ReadyTopic, ShardId, ShardState, ShardStatus, TopicCounts,
    TopicName, TopicSnapshot, Totals,
};
use crate::thrift_gen as t;

pub fn enqueue_items(items: Option<Vec<t::EnqueueItem>>) -> Vec<EnqueueRequestItem> {
    items
        .unwrap_or_default()
        .into_iter()
        .map(|i| EnqueueRequestItem {
            ns: i.ns.unwrap_or_default(),
            topic: i.topic.unwrap_or_default(),
            priority: i.priority.unwrap_or(0),
            payload: i.payload.unwrap_or_default(),
            metadata: i.metadata,
            deliver_after_ms: i.deliver_after_ms,
            lease_ms: i.lease_ms,
            ttl_ms: i.ttl_ms,
            policy: i.policy.map(|p| p.0),
            max_attempts: i.max_attempts,
            dedup_key: i.dedup_key,
        })
        .collect()
}

pub fn topic_requests(req: t::DequeueRequest) -> Vec<TopicRequest> {
    req.topics
        .unwrap_or_default()
        .into_iter()
        .map(|r| TopicRequest {
            ns: r.ns.unwrap_or_default(),
            topic: r.topic.unwrap_or_default(),
            count: r.count.unwrap_or(0),
            before: (r.before_priority, r.before_deliver_after_ms),
        })
        .collect()
}

/// An ack request's ids with their lease ids (`lease_ids`, when given, runs beside
/// `ids`; 0 names no lease).
pub fn ack_items(
    ids: Vec<String>,
    lease_ids: Option<Vec<i64>>,
) -> crate::error::Result<Vec<AckRequestItem>> {
    let leases = match lease_ids {
        None => vec![0; ids.len()],
        Some(l) if l.len() == ids.len() => l,
        Some(l) => {
            return Err(crate::error::Error::invalid(format!(
                "lease_ids has {} entries for {} ids: give one per id (0 for none) or leave it out",
                l.len(),
                ids.len()
            )))
        }
    };
    Ok(ids
        .into_iter()
        .zip(leases)
        .map(|(id, l)| AckRequestItem {
            id,
            lease_id: (l != 0).then_some(l),
        })
        .collect())
}

/// The wire's parallel lists for `items` (see [`ack_items`]).
pub fn ack_request_lists(items: Vec<AckRequestItem>) -> (Vec<String>, Option<Vec<i64>>) {
    let named = items.iter().any(|i| i.lease_id.is_some());
    let leases = named.then(|| items.iter().map(|i| i.lease_id.unwrap_or(0)).collect());
    (items.into_iter().map(|i| i.id).collect(), leases)
}

pub fn nack_items(items: Option<Vec<t::NackItem>>) -> Vec<NackRequestItem> {
    items
        .unwrap_or_default()
        .into_iter()
        .map(|n| NackRequestItem {
            id: n.id.unwrap_or_default(),
            delay_ms: n.delay_ms,
            metadata: n.metadata,
            to_dlq: n.to_dlq.unwrap_or(false),
            lease_id: n.lease_id,
        })
        .collect()
}

pub fn touch_items(items: Option<Vec<t::TouchItem>>) -> Vec<TouchRequestItem> {
    items
        .unwrap_or_default()
        .into_iter()
        .map(|t| TouchRequestItem {
            id: t.id.unwrap_or_default(),
            extend_ms: t.extend_ms.unwrap_or(0),
            lease_id: t.lease_id,
        })
        .collect()
}

fn error_code(c: ErrorCode) -> t::ErrorCode {
    t::ErrorCode(c as i32)
}

pub fn foqs_error(e: Error) -> t::FoqsError {
    t::FoqsError {
        code: Some(error_code(e.code)),
        message: Some(e.message),
        redirect_host: e.redirect,
        retryable: Some(e.retryable),
        outcome_unknown: e.in_doubt.then_some(true),
        retry_after_ms: e.retry_after_ms.map(|ms| ms as i64),
    }
}

pub fn item_error(e: Error) -> t::ItemError {
    t::ItemError {
        code: Some(error_code(e.code)),
        message: Some(e.message),
        redirect_host: e.redirect,
        outcome_unknown: e.in_doubt.then_some(true),
        retry_after_ms: e.retry_after_ms.map(|ms| ms as i64),
    }
}

pub fn enqueue_response(results: Vec<crate::error::Result<(ItemId, bool)>>) -> t::EnqueueResponse {
    t::EnqueueResponse {
        results: Some(
            results
                .into_iter()
                .map(|r| match r {
                    Ok((id, deduplicated)) => t::EnqueueResult {
                        id: Some(id.to_string()),
                        error: None,
                        deduplicated: Some(deduplicated),
                    },
                    Err(e) => t::EnqueueResult {
                        id: None,
                        error: Some(item_error(e)),
                        deduplicated: None,
                    },
                })
                .collect(),
        ),
    }
}

fn policy(p: Policy) -> t::DeliveryPolicy {
    t::DeliveryPolicy(p as i32)
}

pub fn item(i: Item) -> t::Item {
    t::Item {
        id: Some(i.id.to_string()),
        ns: Some(i.ns),
        topic: Some(i.topic),
        priority: Some(i.priority),
        payload: Some(i.payload),
        metadata: Some(i.metadata),
        deliver_after_ms: Some(i.deliver_after_ms),
        enqueued_at_ms: Some(i.enqueued_at_ms),
        delivery_count: Some(i.delivery_count),
        lease_expires_ms: Some(i.lease_expires_ms),
        policy: Some(policy(i.policy)),
        lease_id: Some(i.lease_token),
        lease_ms: Some(i.lease_ms),
    }
}

pub fn item_results(
    ids: Vec<String>,
    results: Vec<crate::error::Result<()>>,
) -> Vec<t::ItemResult> {
    ids.into_iter()
        .zip(results)
        .map(|(id, r)| t::ItemResult {
            id: Some(id),
            error: r.err().map(item_error),
        })
        .collect()
}

pub fn active_topics(page: ActiveTopicsPage) -> t::GetActiveTopicsResponse {
    t::GetActiveTopicsResponse {
        topics: Some(
            page.topics
                .into_iter()
                .map(|c| t::ActiveTopic {
                    topic: Some(c.topic),
                    ready: Some(c.ready),
                    deferred: Some(c.deferred),
                    leased: Some(c.leased),
                    hosts: Some(c.hosts),
                })
                .collect(),
        ),
        next_after: page.next_after,
    }
}

/// A peer's `getHostInfo` shards as this host's (a state it does not know: `stopped`).
pub fn shard_states_from_wire(shards: Option<Vec<t::ShardInfo>>) -> Vec<ShardStatus> {
    shards
        .unwrap_or_default()
        .into_iter()
        .filter_map(|s| {
            let label = s.state.as_deref().unwrap_or("");
            let state = ShardState::from_label(label);
            Some(ShardStatus {
                shard: u32::try_from(s.shard_id?).ok()?,
                // A state this host does not know is not shown as healthy.
                healthy: s.healthy.unwrap_or(false) && state.label() == label,
                items: s.items.unwrap_or(0),
                state,
            })
        })
        .collect()
}

fn shard_infos(shards: Vec<ShardStatus>) -> Vec<t::ShardInfo> {
    shards
        .into_iter()
        .map(|s| t::ShardInfo {
            shard_id: Some(s.shard as i32),
            healthy: Some(s.healthy),
            items: Some(s.items),
            state: Some(s.state.label().to_string()),
        })
        .collect()
}

pub fn host_info(h: HostStatus) -> t::HostInfo {
    t::HostInfo {
        host_id: Some(h.host_id),
        version: Some(crate::VERSION.to_string()),
        shards: Some(shard_infos(h.shards)),
        tier: Some(h.tier),
        addr: Some(h.addr),
        spare_capacity: Some(h.spare),
        peers: Some(
            h.peers
                .into_iter()
                .map(|p| t::PeerInfo {
                    host_id: Some(p.host_id),
                    addr: Some(p.addr),
                    tier: Some(p.tier),
                    shards: Some(p.shards.into_iter().map(|s| s as i32).collect()),
                    reachable: Some(p.load.reachable),
                    spare_capacity: Some(p.load.spare),
                })
                .collect(),
        ),
        manager: Some(h.manager.to_string()),
        ready_topics: Some(ready_topics(h.ready_topics)),
        // This build's shards mark forwarded requests' items (see `store::forwards`).
        forward_marks: Some(true),
        now_ms: Some(h.now_ms),
    }
}

pub fn ready_topics(topics: Vec<ReadyTopic>) -> Vec<t::ReadyTopic> {
    topics
        .into_iter()
        .map(|r| t::ReadyTopic {
            ns: Some(r.topic.ns),
            topic: Some(r.topic.topic),
            ready: Some(r.ready),
            head_priority: r.head.map(|h| h.priority),
            head_deliver_after_ms: r.head.map(|h| h.deliver_after_ms),
            heads: (!r.heads.is_empty()).then(|| {
                r.heads
                    .iter()
                    .map(|h| t::HeadKey {
                        priority: Some(h.priority),
                        deliver_after_ms: Some(h.deliver_after_ms),
                    })
                    .collect()
            }),
        })
        .collect()
}

/// A head is known only when both halves came (an older host sends neither).
pub fn head_from_wire(priority: Option<i32>, deliver_after_ms: Option<i64>) -> Option<Head> {
    Some(Head {
        priority: priority?,
        deliver_after_ms: deliver_after_ms?,
    })
}

pub fn ready_topics_from_wire(topics: Option<Vec<t::ReadyTopic>>) -> Vec<ReadyTopic> {
    topics
        .unwrap_or_default()
        .into_iter()
        .map(|r| ReadyTopic {
            topic: TopicName {
                ns: r.ns.unwrap_or_default(),
                topic: r.topic.unwrap_or_default(),
            },
            ready: r.ready.unwrap_or(0),
            head: head_from_wire(r.head_priority, r.head_deliver_after_ms),
            // Sorted and bounded whatever the peer sent.
            heads: {
                let mut heads: Vec<Head> = r
                    .heads
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|k| head_from_wire(k.priority, k.deliver_after_ms))
                    .take(crate::model::HEADS_MAX)
                    .collect();
                heads.sort_unstable();
                heads
            },
        })
        .collect()
}

pub fn topic_stats(s: TopicSnapshot, age: i64) -> t::TopicStats {
    t::TopicStats {
        ready: Some(s.ready),
        deferred: Some(s.deferred),
        leased: Some(s.leased),
        dead: Some(s.dead),
        enqueued: Some(s.totals.enqueued),
        delivered: Some(s.totals.delivered),
        acked: Some(s.totals.acked),
        nacked: Some(s.totals.nacked),
        expired: Some(s.totals.expired),
        oldest_ready_age_ms: Some(age),
    }
}

pub fn topic_stats_from_wire(s: t::TopicStats) -> (TopicSnapshot, i64) {
    let snap = TopicSnapshot {
        ready: s.ready.unwrap_or(0),
        deferred: s.deferred.unwrap_or(0),
        leased: s.leased.unwrap_or(0),
        dead: s.dead.unwrap_or(0),
        oldest_ready_ms: None,
        totals: Totals {
            enqueued: s.enqueued.unwrap_or(0),
            delivered: s.delivered.unwrap_or(0),
            acked: s.acked.unwrap_or(0),
            nacked: s.nacked.unwrap_or(0),
            expired: s.expired.unwrap_or(0),
        },
    };
    (snap, s.oldest_ready_age_ms.unwrap_or(0))
}

/// An item a peer handed out (or showed): its TTL is not on the wire, and not needed by a
/// host that only passes it on.
pub fn item_from_wire(i: t::Item) -> Result<Item> {
    let id: ItemId = i.id.unwrap_or_default().parse()?;
    Ok(Item {
        id,
        ns: i.ns.unwrap_or_default(),
        topic: i.topic.unwrap_or_default(),
        priority: i.priority.unwrap_or(0),
        payload: i.payload.unwrap_or_default(),
        metadata: i.metadata.unwrap_or_default(),
        deliver_after_ms: i.deliver_after_ms.unwrap_or(0),
        enqueued_at_ms: i.enqueued_at_ms.unwrap_or(0),
        delivery_count: i.delivery_count.unwrap_or(0),
        lease_expires_ms: i.lease_expires_ms.unwrap_or(0),
        lease_ms: i.lease_ms.unwrap_or(0),
        policy: i
            .policy
            .and_then(|p| Policy::from_i32(p.0))
            .unwrap_or(Policy::AtLeastOnce),
        expires_at_ms: None,
        lease_token: i.lease_id.unwrap_or(0),
    })
}

pub fn items_from_wire(items: Option<Vec<t::Item>>) -> Result<Vec<Item>> {
    items
        .unwrap_or_default()
        .into_iter()
        .map(item_from_wire)
        .collect()
}

// From the wire, for calls to peers.

pub fn enqueue_item_to_wire(i: EnqueueRequestItem) -> t::EnqueueItem {
    t::EnqueueItem {
        ns: Some(i.ns),
        topic: Some(i.topic),
        priority: Some(i.priority),
        payload: Some(i.payload),
        metadata: i.metadata,
        deliver_after_ms: i.deliver_after_ms,
        lease_ms: i.lease_ms,
        ttl_ms: i.ttl_ms,
        policy: i.policy.map(t::DeliveryPolicy),
        max_attempts: i.max_attempts,
        dedup_key: i.dedup_key,
    }
}

pub fn nack_item_to_wire(n: NackRequestItem) -> t::NackItem {
    t::NackItem {
        id: Some(n.id),
        delay_ms: n.delay_ms,
        metadata: n.metadata,
        to_dlq: Some(n.to_dlq),
        lease_id: n.lease_id,
    }
}

pub fn touch_item_to_wire(i: TouchRequestItem) -> t::TouchItem {
    t::TouchItem {
        id: Some(i.id),
        extend_ms: Some(i.extend_ms),
        lease_id: i.lease_id,
    }
}

fn code_from_wire(c: Option<t::ErrorCode>) -> ErrorCode {
    match c.map(|c| c.0) {
        Some(1) => ErrorCode::InvalidArgument,
        Some(2) => ErrorCode::PayloadTooLarge,
        Some(3) => ErrorCode::RateLimited,
        Some(4) => ErrorCode::Unavailable,
        Some(5) => ErrorCode::NotFound,
        Some(6) => ErrorCode::WrongHost,
        Some(7) => ErrorCode::UnknownNamespace,
        Some(9) => ErrorCode::PermissionDenied,
        _ => ErrorCode::Internal,
    }
}

pub fn error_from_wire(e: t::FoqsError) -> Error {
    let mut err = Error::new(code_from_wire(e.code), e.message.unwrap_or_default());
    err.redirect = e.redirect_host;
    err.in_doubt = e.outcome_unknown == Some(true);
    err.retry_after_ms = e.retry_after_ms.map(|ms| ms.max(0) as u64);
    err
}

fn item_error_from_wire(e: t::ItemError) -> Error {
    let mut err = Error::new(code_from_wire(e.code), e.message.unwrap_or_default());
    err.redirect = e.redirect_host;
    err.in_doubt = e.outcome_unknown == Some(true);
    err.retry_after_ms = e.retry_after_ms.map(|ms| ms.max(0) as u64);
    err
}

pub fn item_results_from_wire(rs: Option<Vec<t::ItemResult>>) -> Vec<Result<()>> {
    rs.unwrap_or_default()
        .into_iter()
        .map(|r| match r.error {
            Some(e) => Err(item_error_from_wire(e)),
            None => Ok(()),
        })
        .collect()
}

pub fn enqueue_results_from_wire(rs: Option<Vec<t::EnqueueResult>>) -> Vec<Result<(ItemId, bool)>> {
    rs.unwrap_or_default()
        .into_iter()
        .map(|r| match (r.id, r.error) {
            (_, Some(e)) => Err(item_error_from_wire(e)),
            (Some(id), None) => Ok((id.parse()?, r.deduplicated.unwrap_or(false))),
            (None, None) => Err(Error::new(
                ErrorCode::Internal,
                "a peer sent neither id nor error",
            )),
        })
        .collect()
}

pub fn active_topics_from_wire(r: t::GetActiveTopicsResponse) -> ActiveTopicsPage {
    ActiveTopicsPage {
        topics: r
            .topics
            .unwrap_or_default()
            .into_iter()
            .map(|t| TopicCounts {
                topic: t.topic.unwrap_or_default(),
                ready: t.ready.unwrap_or(0),
                deferred: t.deferred.unwrap_or(0),
                leased: t.leased.unwrap_or(0),
                hosts: Vec::new(),
            })
            .collect(),
        next_after: r.next_after,
    }
}

/// `enqueueOutcome`'s question, as the serving host reads it: a forward token with its
/// item count, or a batch token.
pub fn outcome_ask(req: &t::EnqueueOutcomeRequest) -> Result<OutcomeAsk> {
    match (req.forward_token, req.items, req.batch_token) {
        (Some(token), Some(items), None) if items > 0 => Ok(OutcomeAsk::Forward {
            token,
            items: items as u32,
        }),
        (None, None, Some(token)) => Ok(OutcomeAsk::Batch { token }),
        _ => Err(Error::invalid(
            "enqueueOutcome takes forward_token with items (at least 1), or batch_token alone",
        )),
    }
}

pub fn outcome_ask_to_wire(shards: Vec<ShardId>, ask: OutcomeAsk) -> t::EnqueueOutcomeRequest {
    let (forward_token, items, batch_token) = match ask {
        OutcomeAsk::Forward { token, items } => (Some(token), Some(items as i32), None),
        OutcomeAsk::Batch { token } => (None, None, Some(token)),
    };
    t::EnqueueOutcomeRequest {
        shards: Some(shards.into_iter().map(|s| s as i32).collect()),
        forward_token,
        items,
        batch_token,
    }
}

pub fn enqueue_outcomes_to_wire(outcomes: Vec<ShardOutcome>) -> t::EnqueueOutcomeResponse {
    let shards = outcomes
        .into_iter()
        .map(|o| {
            let (state, error) = match o.state {
                OutcomeState::Committed => ("committed", None),
                OutcomeState::NotCommitted => ("not_committed", None),
                OutcomeState::Forgotten => ("forgotten", None),
                OutcomeState::Unserved => ("unserved", None),
                OutcomeState::Error(e) => ("error", Some(e)),
            };
            t::ShardEnqueueOutcome {
                shard_id: Some(o.shard as i32),
                state: Some(state.to_string()),
                items: Some(
                    o.items
                        .into_iter()
                        .map(|(p, id, dup)| t::ForwardedItem {
                            position: Some(p as i32),
                            id: Some(id.to_string()),
                            deduplicated: Some(dup),
                        })
                        .collect(),
                ),
                error,
            }
        })
        .collect();
    t::EnqueueOutcomeResponse {
        shards: Some(shards),
    }
}

/// A peer's answer; an entry it could not make sense of reads as not answered.
pub fn enqueue_outcomes_from_wire(r: t::EnqueueOutcomeResponse) -> Vec<ShardOutcome> {
    r.shards
        .unwrap_or_default()
        .into_iter()
        .map(|s| {
            let shard = s
                .shard_id
                .and_then(|s| u32::try_from(s).ok())
                .unwrap_or(u32::MAX);
            let items: Option<Vec<(u32, ItemId, bool)>> = s
                .items
                .unwrap_or_default()
                .into_iter()
                .map(|i| {
                    let id: ItemId = i.id?.parse().ok()?;
                    let p = u32::try_from(i.position?).ok()?;
                    Some((p, id, i.deduplicated.unwrap_or(false)))
                })
                .collect();
            let state = match (s.state.as_deref(), &items) {
                (_, None) => OutcomeState::Error("a peer sent an unreadable item".into()),
                (Some("committed"), _) => OutcomeState::Committed,
                (Some("not_committed"), _) => OutcomeState::NotCommitted,
                (Some("forgotten"), _) => OutcomeState::Forgotten,
                (Some("unserved"), _) => OutcomeState::Unserved,
                (Some("error"), _) => OutcomeState::Error(s.error.unwrap_or_default()),
                (other, _) => OutcomeState::Error(format!("a peer answered state {other:?}")),
            };
            ShardOutcome {
                shard,
                state,
                items: items.unwrap_or_default(),
            }
        })
        .collect()
}

/// Splits a domain result into the generated result struct's two fields.
pub(super) fn split<T>(r: crate::error::Result<T>) -> (Option<T>, Option<t::FoqsError>) {
    match r {
        Ok(v) => (Some(v), None),
        Err(e) => (None, Some(foqs_error(e))),
    }
}
