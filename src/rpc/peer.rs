//! The [`Peers`] API over [`PeerClient`]: this host's calls to other hosts (forwarded
//! enqueues, acks, nacks and touches, topic listings, capacity polls), each a Thrift
//! method's arguments and result (the connections and one call are `peer_conn.rs`).

use futures::future::BoxFuture;

use super::convert;
use super::peer_conn::PeerClient;
use crate::core::{
    AckRequestItem, ActiveTopicsPage, DeadItem, EnqueueOutcome, EnqueueRequestItem, Forwarded,
    NackRequestItem, OutcomeAsk, PeerSummary, Peers, ShardOutcome, TouchRequestItem,
};
use crate::error::{Error, Result};
use crate::model::{Head, Item, Progress, ReadyTopic, ShardId, TopicName, TopicSnapshot};
use crate::thrift_gen as t;

/// One call of `method` with `args`, its reply read as the generated result struct
/// `$result` (`result_value` or the declared `err`), the value mapped by `$map`.
macro_rules! call_method {
    ($self:ident, $addr:ident, $method:literal, $args:expr, $result:ty, $map:expr) => {
        Box::pin(async move {
            let args = $args;
            let r = $self
                .call(
                    $addr,
                    $method,
                    |o| args.write_to_out_protocol(o),
                    <$result>::read_from_in_protocol,
                )
                .await?;
            outcome(r.result_value, r.err).map($map)
        })
    };
}

/// A batched admin call's answer.
fn progress(v: t::DlqCountResponse) -> Progress {
    Progress {
        count: v.count.unwrap_or(0),
        more: v.more.unwrap_or(false),
    }
}

/// A method's declared error, or its value.
fn outcome<T>(value: Option<T>, err: Option<t::FoqsError>) -> Result<T> {
    match (value, err) {
        (_, Some(e)) => Err(convert::error_from_wire(e)),
        (Some(v), None) => Ok(v),
        (None, None) => Err(Error::unavailable("a peer sent an empty reply")),
    }
}

impl Peers for PeerClient {
    fn enqueue<'a>(
        &'a self,
        addr: &'a str,
        items: Vec<EnqueueRequestItem>,
        from: &'a str,
        token: i64,
        acting: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<EnqueueOutcome>>> {
        let args = t::FoqsEnqueueArgs {
            req: t::EnqueueRequest {
                forwarded_for: acting.map(str::to_string),
                items: Some(
                    items
                        .into_iter()
                        .map(convert::enqueue_item_to_wire)
                        .collect(),
                ),
                forwarded_by: Some(from.to_string()),
                forward_token: Some(token),
            },
        };
        call_method!(self, addr, "enqueue", args, t::FoqsEnqueueResult, |v| {
            convert::enqueue_results_from_wire(v.results)
        })
    }

    fn ack<'a>(
        &'a self,
        addr: &'a str,
        items: Vec<AckRequestItem>,
        from: Forwarded<'a>,
    ) -> BoxFuture<'a, Result<Vec<Result<()>>>> {
        let (ids, lease_ids) = convert::ack_request_lists(items);
        let args = t::FoqsAckArgs {
            req: t::AckRequest {
                ids: Some(ids),
                forwarded_by: Some(from.by.to_string()),
                forwarded_for: from.for_identity.map(str::to_string),
                lease_ids,
            },
        };
        call_method!(self, addr, "ack", args, t::FoqsAckResult, |v| {
            convert::item_results_from_wire(v.results)
        })
    }

    fn nack<'a>(
        &'a self,
        addr: &'a str,
        items: Vec<NackRequestItem>,
        from: Forwarded<'a>,
        token: i64,
    ) -> BoxFuture<'a, Result<Vec<Result<()>>>> {
        let args = t::FoqsNackArgs {
            req: t::NackRequest {
                items: Some(items.into_iter().map(convert::nack_item_to_wire).collect()),
                forwarded_by: Some(from.by.to_string()),
                forwarded_for: from.for_identity.map(str::to_string),
                nack_token: Some(token),
            },
        };
        call_method!(self, addr, "nack", args, t::FoqsNackResult, |v| {
            convert::item_results_from_wire(v.results)
        })
    }

    fn touch<'a>(
        &'a self,
        addr: &'a str,
        items: Vec<TouchRequestItem>,
        from: Forwarded<'a>,
    ) -> BoxFuture<'a, Result<Vec<Result<()>>>> {
        let args = t::FoqsTouchArgs {
            req: t::TouchRequest {
                items: Some(items.into_iter().map(convert::touch_item_to_wire).collect()),
                forwarded_by: Some(from.by.to_string()),
                forwarded_for: from.for_identity.map(str::to_string),
            },
        };
        call_method!(self, addr, "touch", args, t::FoqsTouchResult, |v| {
            convert::item_results_from_wire(v.results)
        })
    }

    fn active_topics<'a>(
        &'a self,
        addr: &'a str,
        ns: &'a str,
        limit: i32,
        after: Option<String>,
        acting: Option<&'a str>,
    ) -> BoxFuture<'a, Result<ActiveTopicsPage>> {
        let args = t::FoqsGetActiveTopicsArgs {
            req: t::GetActiveTopicsRequest {
                forwarded_for: acting.map(str::to_string),
                ns: Some(ns.to_string()),
                limit: Some(limit),
                after,
                local_only: Some(true),
            },
        };
        call_method!(
            self,
            addr,
            "getActiveTopics",
            args,
            t::FoqsGetActiveTopicsResult,
            convert::active_topics_from_wire
        )
    }

    fn poll<'a>(&'a self, addr: &'a str) -> BoxFuture<'a, Result<PeerSummary>> {
        call_method!(
            self,
            addr,
            "getHostInfo",
            t::FoqsGetHostInfoArgs {},
            t::FoqsGetHostInfoResult,
            |h| PeerSummary {
                spare: h.spare_capacity.unwrap_or(0),
                forward_marks: h.forward_marks.unwrap_or(false),
                ready: convert::ready_topics_from_wire(h.ready_topics),
                shards: convert::shard_states_from_wire(h.shards),
                now_ms: h.now_ms,
            }
        )
    }

    fn notify_ready<'a>(
        &'a self,
        addr: &'a str,
        from: &'a str,
        topics: Vec<ReadyTopic>,
    ) -> BoxFuture<'a, Result<()>> {
        let args = t::FoqsNotifyReadyArgs {
            req: t::NotifyReadyRequest {
                host_id: Some(from.to_string()),
                topics: Some(convert::ready_topics(topics)),
            },
        };
        Box::pin(async move {
            let r = self
                .call(
                    addr,
                    "notifyReady",
                    |o| args.write_to_out_protocol(o),
                    t::FoqsNotifyReadyResult::read_from_in_protocol,
                )
                .await?;
            match r.err {
                Some(e) => Err(convert::error_from_wire(e)),
                None => Ok(()),
            }
        })
    }

    fn dequeue<'a>(
        &'a self,
        addr: &'a str,
        topic: &'a TopicName,
        count: usize,
        before: Option<Head>,
        from: &'a str,
        acting: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<Item>>> {
        let args = t::FoqsDequeueArgs {
            req: t::DequeueRequest {
                forwarded_for: acting.map(str::to_string),
                topics: Some(vec![t::TopicRequest {
                    ns: Some(topic.ns.clone()),
                    topic: Some(topic.topic.clone()),
                    count: Some(count as i32),
                    before_priority: before.map(|h| h.priority),
                    before_deliver_after_ms: before.map(|h| h.deliver_after_ms),
                }]),
                wait_ms: None,
                local_only: Some(true),
                forwarded_by: Some(from.to_string()),
            },
        };
        Box::pin(async move {
            let r = self
                .call(
                    addr,
                    "dequeue",
                    |o| args.write_to_out_protocol(o),
                    t::FoqsDequeueResult::read_from_in_protocol,
                )
                .await?;
            convert::items_from_wire(outcome(r.result_value, r.err)?.items)
        })
    }

    fn peek<'a>(
        &'a self,
        addr: &'a str,
        topic: &'a TopicName,
        count: i32,
        acting: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<Item>>> {
        let args = t::FoqsPeekArgs {
            req: t::PeekRequest {
                forwarded_for: acting.map(str::to_string),
                ns: Some(topic.ns.clone()),
                topic: Some(topic.topic.clone()),
                count: Some(count),
                local_only: Some(true),
            },
        };
        Box::pin(async move {
            let r = self
                .call(
                    addr,
                    "peek",
                    |o| args.write_to_out_protocol(o),
                    t::FoqsPeekResult::read_from_in_protocol,
                )
                .await?;
            convert::items_from_wire(outcome(r.result_value, r.err)?.items)
        })
    }

    fn topic_stats<'a>(
        &'a self,
        addr: &'a str,
        topic: &'a TopicName,
        acting: Option<&'a str>,
    ) -> BoxFuture<'a, Result<(TopicSnapshot, i64)>> {
        let args = t::FoqsTopicStatsArgs {
            req: t::TopicStatsRequest {
                forwarded_for: acting.map(str::to_string),
                ns: Some(topic.ns.clone()),
                topic: Some(topic.topic.clone()),
                local_only: Some(true),
            },
        };
        call_method!(
            self,
            addr,
            "topicStats",
            args,
            t::FoqsTopicStatsResult,
            convert::topic_stats_from_wire
        )
    }

    fn dlq_list<'a>(
        &'a self,
        addr: &'a str,
        topic: &'a TopicName,
        limit: i32,
        after: Option<String>,
        acting: Option<&'a str>,
    ) -> BoxFuture<'a, Result<(Vec<DeadItem>, Option<String>)>> {
        let args = t::FoqsDlqListArgs {
            req: t::DlqListRequest {
                forwarded_for: acting.map(str::to_string),
                ns: Some(topic.ns.clone()),
                topic: Some(topic.topic.clone()),
                limit: Some(limit),
                after,
                local_only: Some(true),
            },
        };
        Box::pin(async move {
            let r = self
                .call(
                    addr,
                    "dlqList",
                    |o| args.write_to_out_protocol(o),
                    t::FoqsDlqListResult::read_from_in_protocol,
                )
                .await?;
            let page = outcome(r.result_value, r.err)?;
            let items = page
                .items
                .unwrap_or_default()
                .into_iter()
                .map(|d| {
                    let item = convert::item_from_wire(d.item.unwrap_or_default())?;
                    Ok((item, d.died_at_ms.unwrap_or(0)))
                })
                .collect::<Result<Vec<_>>>()?;
            Ok((items, page.next_after))
        })
    }

    fn dlq_requeue<'a>(
        &'a self,
        addr: &'a str,
        ids: Vec<String>,
        from: Forwarded<'a>,
        token: i64,
    ) -> BoxFuture<'a, Result<Vec<Result<()>>>> {
        let args = t::FoqsDlqRequeueArgs {
            req: t::DlqRequeueRequest {
                ids: Some(ids),
                forwarded_by: Some(from.by.to_string()),
                forwarded_for: from.for_identity.map(str::to_string),
                requeue_token: Some(token),
            },
        };
        call_method!(
            self,
            addr,
            "dlqRequeue",
            args,
            t::FoqsDlqRequeueResult,
            |v| { convert::item_results_from_wire(v.results) }
        )
    }

    fn dlq_requeue_all<'a>(
        &'a self,
        addr: &'a str,
        topic: &'a TopicName,
        max: Option<i64>,
        acting: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Progress>> {
        let args = t::FoqsDlqRequeueAllArgs {
            req: t::DlqRequeueAllRequest {
                forwarded_for: acting.map(str::to_string),
                ns: Some(topic.ns.clone()),
                topic: Some(topic.topic.clone()),
                max,
                local_only: Some(true),
            },
        };
        call_method!(
            self,
            addr,
            "dlqRequeueAll",
            args,
            t::FoqsDlqRequeueAllResult,
            progress
        )
    }

    fn dlq_purge<'a>(
        &'a self,
        addr: &'a str,
        topic: &'a TopicName,
        acting: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Progress>> {
        let args = t::FoqsDlqPurgeArgs {
            req: t::DlqPurgeRequest {
                forwarded_for: acting.map(str::to_string),
                ns: Some(topic.ns.clone()),
                topic: Some(topic.topic.clone()),
                local_only: Some(true),
            },
        };
        call_method!(
            self,
            addr,
            "dlqPurge",
            args,
            t::FoqsDlqPurgeResult,
            progress
        )
    }

    fn enqueue_outcome<'a>(
        &'a self,
        addr: &'a str,
        shards: Vec<ShardId>,
        ask: OutcomeAsk,
    ) -> BoxFuture<'a, Result<Vec<ShardOutcome>>> {
        let args = t::FoqsEnqueueOutcomeArgs {
            req: convert::outcome_ask_to_wire(shards, ask),
        };
        call_method!(
            self,
            addr,
            "enqueueOutcome",
            args,
            t::FoqsEnqueueOutcomeResult,
            convert::enqueue_outcomes_from_wire
        )
    }
}
