//! One decoded call run against [`Host`]: the request's fields become the core's
//! arguments, and its result the generated result struct.

use super::convert::{self, split};
use super::{replication, Call, PeerOnly, Reply};
use crate::core::{Caller, Host};
use crate::thrift_gen as t;

/// A long poll's wait, bounded by the client's own timeout (THeader `client_timeout`; 0
/// means none, as in fbthrift): it ends at nine tenths of it, so that the (empty) reply
/// arrives before the client gives up. A wait out of range is left for validation to
/// refuse.
pub(super) fn bounded_wait(wait_ms: Option<i64>, client_timeout_ms: Option<u64>) -> Option<i64> {
    match (wait_ms, client_timeout_ms) {
        (Some(w), Some(t)) if w > 0 && t > 0 => {
            let budget = i64::try_from(t - t / 10).unwrap_or(i64::MAX);
            Some(w.min(budget))
        }
        _ => wait_ms,
    }
}

/// The forwarding host's id; an empty string (a careless client) counts as absent.
fn forwarder(f: &Option<String>) -> Option<&str> {
    f.as_deref().filter(|s| !s.is_empty())
}

pub(super) async fn execute(
    call: Call,
    host: &Host,
    caller: &Caller,
    client_timeout_ms: Option<u64>,
) -> Reply {
    // A call a peer routed here acts for the client it names in `forwarded_for`; from a
    // caller that is not a peer, the method's declared error (PERMISSION_DENIED).
    macro_rules! acting {
        ($req:expr, $reply:path, $result:ident) => {
            match host.acting_as(caller, $req.forwarded_for.as_deref()) {
                Ok(c) => c,
                Err(e) => {
                    let (result_value, err) = split(Err(e));
                    return $reply(t::$result { result_value, err });
                }
            }
        };
    }
    // A listing call waits for a place among its caller's (see `core::listing`); the
    // place is held until the reply is built.
    macro_rules! listing {
        ($reply:path, $result:ident) => {
            match host.listing_pass(caller) {
                Ok(p) => p,
                Err(e) => {
                    let (result_value, err) = split(Err(e));
                    return $reply(t::$result { result_value, err });
                }
            }
        };
    }
    match call {
        Call::Enqueue(req) => {
            let r = host
                .enqueue(
                    caller,
                    convert::enqueue_items(req.items),
                    (forwarder(&req.forwarded_by), req.forwarded_for.as_deref()),
                    req.forward_token,
                )
                .await
                .map(convert::enqueue_response);
            let (result_value, err) = split(r);
            Reply::Enqueue(t::FoqsEnqueueResult { result_value, err })
        }
        Call::Dequeue(req) => {
            let caller = &acting!(req, Reply::Dequeue, FoqsDequeueResult);
            let wait_ms = bounded_wait(req.wait_ms, client_timeout_ms);
            // A dequeue a peer routed here is served from this host's shards only.
            let local_only =
                req.local_only.unwrap_or(false) || forwarder(&req.forwarded_by).is_some();
            let r = host
                .dequeue(caller, convert::topic_requests(req), wait_ms, local_only)
                .await
                .map(|items| t::DequeueResponse {
                    items: Some(items.into_iter().map(convert::item).collect()),
                });
            let (result_value, err) = split(r);
            Reply::Dequeue(t::FoqsDequeueResult { result_value, err })
        }
        Call::Ack(req) => {
            let ids = req.ids.unwrap_or_default();
            let from = (forwarder(&req.forwarded_by), req.forwarded_for.as_deref());
            let r = match convert::ack_items(ids.clone(), req.lease_ids) {
                Ok(items) => host.ack_items(caller, items, from).await,
                Err(e) => Err(e),
            }
            .map(|res| t::AckResponse {
                results: Some(convert::item_results(ids, res)),
            });
            let (result_value, err) = split(r);
            Reply::Ack(t::FoqsAckResult { result_value, err })
        }
        Call::Nack(req) => {
            let items = convert::nack_items(req.items);
            let ids = items.iter().map(|n| n.id.clone()).collect();
            let from = (forwarder(&req.forwarded_by), req.forwarded_for.as_deref());
            let r = host
                .nack(caller, items, from, req.nack_token)
                .await
                .map(|res| t::NackResponse {
                    results: Some(convert::item_results(ids, res)),
                });
            let (result_value, err) = split(r);
            Reply::Nack(t::FoqsNackResult { result_value, err })
        }
        Call::GetActiveTopics(req) => {
            let _place = listing!(Reply::GetActiveTopics, FoqsGetActiveTopicsResult);
            let caller = &acting!(req, Reply::GetActiveTopics, FoqsGetActiveTopicsResult);
            let ns = req.ns.unwrap_or_default();
            let r = host
                .active_topics(
                    caller,
                    &ns,
                    req.limit,
                    req.after,
                    req.local_only.unwrap_or(false),
                )
                .await
                .map(convert::active_topics);
            let (result_value, err) = split(r);
            Reply::GetActiveTopics(t::FoqsGetActiveTopicsResult { result_value, err })
        }
        Call::TopicStats(req) => {
            let _place = listing!(Reply::TopicStats, FoqsTopicStatsResult);
            let caller = &acting!(req, Reply::TopicStats, FoqsTopicStatsResult);
            let (ns, topic) = (req.ns.unwrap_or_default(), req.topic.unwrap_or_default());
            let r = host
                .topic_stats(caller, &ns, &topic, req.local_only.unwrap_or(false))
                .await
                .map(|(s, age)| convert::topic_stats(s, age));
            let (result_value, err) = split(r);
            Reply::TopicStats(t::FoqsTopicStatsResult { result_value, err })
        }
        Call::DlqList(req) => {
            let _place = listing!(Reply::DlqList, FoqsDlqListResult);
            let caller = &acting!(req, Reply::DlqList, FoqsDlqListResult);
            let (ns, topic) = (req.ns.unwrap_or_default(), req.topic.unwrap_or_default());
            let r = host
                .dlq_list(
                    caller,
                    &ns,
                    &topic,
                    req.limit,
                    req.after,
                    req.local_only.unwrap_or(false),
                )
                .await
                .map(|(items, next_after)| t::DlqListResponse {
                    items: Some(
                        items
                            .into_iter()
                            .map(|(i, died_at_ms)| t::DeadItem {
                                item: Some(convert::item(i)),
                                died_at_ms: Some(died_at_ms),
                            })
                            .collect(),
                    ),
                    next_after,
                });
            let (result_value, err) = split(r);
            Reply::DlqList(t::FoqsDlqListResult { result_value, err })
        }
        Call::DlqRequeue(req) => {
            let ids = req.ids.unwrap_or_default();
            let from = (forwarder(&req.forwarded_by), req.forwarded_for.as_deref());
            let r = host
                .dlq_requeue(caller, ids.clone(), from, req.requeue_token)
                .await
                .map(|res| t::DlqRequeueResponse {
                    results: Some(convert::item_results(ids, res)),
                });
            let (result_value, err) = split(r);
            Reply::DlqRequeue(t::FoqsDlqRequeueResult { result_value, err })
        }
        Call::DlqRequeueAll(req) => {
            let caller = &acting!(req, Reply::DlqRequeueAll, FoqsDlqRequeueAllResult);
            let (ns, topic) = (req.ns.unwrap_or_default(), req.topic.unwrap_or_default());
            let r = host
                .dlq_requeue_all(
                    caller,
                    &ns,
                    &topic,
                    req.max,
                    req.local_only.unwrap_or(false),
                )
                .await
                .map(|p| t::DlqCountResponse {
                    count: Some(p.count),
                    more: Some(p.more),
                });
            let (result_value, err) = split(r);
            Reply::DlqRequeueAll(t::FoqsDlqRequeueAllResult { result_value, err })
        }
        Call::DlqPurge(req) => {
            let caller = &acting!(req, Reply::DlqPurge, FoqsDlqPurgeResult);
            let (ns, topic) = (req.ns.unwrap_or_default(), req.topic.unwrap_or_default());
            let r = host
                .dlq_purge(caller, &ns, &topic, req.local_only.unwrap_or(false))
                .await
                .map(|p| t::DlqCountResponse {
                    count: Some(p.count),
                    more: Some(p.more),
                });
            let (result_value, err) = split(r);
            Reply::DlqPurge(t::FoqsDlqPurgeResult { result_value, err })
        }
        Call::Peek(req) => {
            let _place = listing!(Reply::Peek, FoqsPeekResult);
            let caller = &acting!(req, Reply::Peek, FoqsPeekResult);
            let (ns, topic) = (req.ns.unwrap_or_default(), req.topic.unwrap_or_default());
            let r = host
                .peek(
                    caller,
                    &ns,
                    &topic,
                    req.count.unwrap_or(0),
                    req.local_only.unwrap_or(false),
                )
                .await
                .map(|items| t::PeekResponse {
                    items: Some(items.into_iter().map(convert::item).collect()),
                });
            let (result_value, err) = split(r);
            Reply::Peek(t::FoqsPeekResult { result_value, err })
        }
        Call::Touch(req) => {
            let items = convert::touch_items(req.items);
            let ids = items.iter().map(|t| t.id.clone()).collect();
            let from = (forwarder(&req.forwarded_by), req.forwarded_for.as_deref());
            let r = host
                .touch(caller, items, from)
                .await
                .map(|res| t::TouchResponse {
                    results: Some(convert::item_results(ids, res)),
                });
            let (result_value, err) = split(r);
            Reply::Touch(t::FoqsTouchResult { result_value, err })
        }
        Call::NotifyReady(req) => {
            let topics = convert::ready_topics_from_wire(req.topics);
            let from = req.host_id.unwrap_or_default();
            let err = host
                .peer_ready(caller, &from, topics)
                .err()
                .map(convert::foqs_error);
            Reply::NotifyReady(t::FoqsNotifyReadyResult { err })
        }
        Call::EnqueueOutcome(req) => {
            let r = match convert::outcome_ask(&req) {
                Ok(ask) => host
                    .enqueue_outcome(
                        caller,
                        req.shards
                            .unwrap_or_default()
                            .into_iter()
                            .filter_map(|s| u32::try_from(s).ok())
                            .collect(),
                        ask,
                    )
                    .await
                    .map(convert::enqueue_outcomes_to_wire),
                Err(e) => Err(e),
            };
            let (result_value, err) = split(r);
            Reply::EnqueueOutcome(t::FoqsEnqueueOutcomeResult { result_value, err })
        }
        Call::PeerLogin(req) => {
            let err = host
                .peer_login(
                    caller,
                    req.host_id.as_deref().unwrap_or_default(),
                    req.secret.as_deref().unwrap_or_default(),
                )
                .err()
                .map(convert::foqs_error);
            Reply::PeerLogin(t::FoqsPeerLoginResult { err })
        }
        Call::NotPeer(only) => {
            let err = Some(convert::foqs_error(crate::core::not_a_peer(
                caller,
                only.method(),
            )));
            match only {
                PeerOnly::NotifyReady => Reply::NotifyReady(t::FoqsNotifyReadyResult { err }),
                PeerOnly::EnqueueOutcome => Reply::EnqueueOutcome(t::FoqsEnqueueOutcomeResult {
                    result_value: None,
                    err,
                }),
            }
        }
        Call::Replication(call) => {
            Reply::Replication(replication::dispatch(host, caller, call).await)
        }
        Call::GetHostInfo => {
            let info = convert::host_info(host.host_status(caller));
            Reply::GetHostInfo(t::FoqsGetHostInfoResult {
                result_value: Some(info),
                err: None,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_poll_ends_before_the_clients_own_timeout() {
        assert_eq!(bounded_wait(Some(10_000), Some(1_000)), Some(900));
        assert_eq!(bounded_wait(Some(100), Some(1_000)), Some(100));
        // 0 is "no timeout" in fbthrift; a bad wait is left for validation to refuse.
        assert_eq!(bounded_wait(Some(10_000), Some(0)), Some(10_000));
        assert_eq!(bounded_wait(Some(-5), Some(1_000)), Some(-5));
        assert_eq!(bounded_wait(None, Some(1_000)), None);
    }
}
