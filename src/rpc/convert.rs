//! Conversions between the generated Thrift types and the domain types, in one place.
//! Absent fields of the generated structs (all are `Option`) become the domain's defaults:
//! an absent string is empty (and then fails validation), an absent number is 0.

use crate::core::{ActiveTopicsPage, EnqueueRequestItem, NackRequestItem, TopicRequest};
use crate::error::{Error, ErrorCode};
use crate::model::{Item, ItemId, Policy, ShardStatus};
use crate::thrift_gen as t;

pub fn enqueue_items(req: t::EnqueueRequest) -> Vec<EnqueueRequestItem> {
    req.items
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
        })
        .collect()
}

pub fn nack_items(req: t::NackRequest) -> Vec<NackRequestItem> {
    req.items
        .unwrap_or_default()
        .into_iter()
        .map(|n| NackRequestItem {
            id: n.id.unwrap_or_default(),
            delay_ms: n.delay_ms,
            metadata: n.metadata,
            to_dlq: n.to_dlq.unwrap_or(false),
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
        redirect_host: None,
        retryable: Some(e.retryable),
    }
}

pub fn item_error(e: Error) -> t::ItemError {
    t::ItemError {
        code: Some(error_code(e.code)),
        message: Some(e.message),
        redirect_host: None,
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
                })
                .collect(),
        ),
        next_after: page.next_after,
    }
}

pub fn host_info(host_id: &str, shards: Vec<ShardStatus>) -> t::HostInfo {
    t::HostInfo {
        host_id: Some(host_id.to_string()),
        version: Some(crate::VERSION.to_string()),
        shards: Some(
            shards
                .into_iter()
                .map(|s| t::ShardInfo {
                    shard_id: Some(s.shard as i32),
                    healthy: Some(s.healthy),
                    items: Some(s.items),
                })
                .collect(),
        ),
    }
}
