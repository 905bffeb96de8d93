//! [`PeerClient`]: this host's calls to other hosts (forwarded enqueues, acks, nacks and
//! touches, topic listings, capacity polls), over framed binary Thrift on pooled TCP
//! connections: one `bb8` pool per peer address, created on first use.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use thrift::protocol::{
    TBinaryInputProtocol, TBinaryOutputProtocol, TInputProtocol, TMessageIdentifier, TMessageType,
    TOutputProtocol,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{config_for, convert, describe};
use crate::core::{
    AckRequestItem, ActiveTopicsPage, DeadItem, EnqueueOutcome, EnqueueRequestItem, Forwarded,
    NackRequestItem, OutcomeAsk, PeerSummary, Peers, ShardOutcome, TouchRequestItem,
};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::model::{Head, Item, Progress, ReadyTopic, ShardId, TopicName, TopicSnapshot};
use crate::thrift_gen as t;

/// Largest reply frame accepted from a peer (a full dequeue-sized reply fits many times).
const REPLY_FRAME_BYTES_MAX: usize = 64 * 1024 * 1024;

pub struct PeerClient {
    pools: Mutex<HashMap<String, bb8::Pool<Connector>>>,
    connections_max: u32,
    timeout: Duration,
    /// TLS towards peers (`cluster.tls_*`); `None`: plain TCP.
    tls: Option<tokio_rustls::TlsConnector>,
    metrics: Arc<Metrics>,
}

struct Connector {
    addr: String,
    timeout: Duration,
    tls: Option<tokio_rustls::TlsConnector>,
}

/// A peer connection's byte stream: plain TCP or TLS.
trait PeerIo: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> PeerIo for T {}

struct Conn {
    stream: Box<dyn PeerIo>,
    /// Set while a call is in flight: a call abandoned half-way (timeout) leaves the
    /// stream out of step, and the pool then drops it.
    broken: bool,
    seq: i32,
}

impl bb8::ManageConnection for Connector {
    type Connection = Conn;
    type Error = std::io::Error;

    async fn connect(&self) -> std::io::Result<Conn> {
        let timed_out = || std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out");
        let stream = tokio::time::timeout(self.timeout, TcpStream::connect(&self.addr))
            .await
            .map_err(|_| timed_out())??;
        stream.set_nodelay(true)?;
        let stream: Box<dyn PeerIo> = match &self.tls {
            None => Box::new(stream),
            Some(tls) => {
                let name = crate::tls::server_name(&self.addr)
                    .map_err(|e| std::io::Error::other(e.to_string()))?;
                let s = tokio::time::timeout(self.timeout, tls.connect(name, stream))
                    .await
                    .map_err(|_| timed_out())??;
                Box::new(s)
            }
        };
        Ok(Conn {
            stream,
            broken: false,
            seq: 0,
        })
    }

    async fn is_valid(&self, conn: &mut Conn) -> std::io::Result<()> {
        if conn.broken {
            return Err(std::io::Error::other("broken"));
        }
        // An idle connection has nothing to read: one that is readable was closed by the
        // peer (it restarted, or died: its kernel sent FIN or RST), or is out of step.
        // Without this look, the next call wrote into it and read EOF, and a forwarded
        // call the peer never received was answered outcome_unknown.
        let mut byte = [0u8; 1];
        match futures::FutureExt::now_or_never(conn.stream.read(&mut byte)) {
            None => Ok(()),
            Some(Ok(0)) => Err(std::io::Error::other("closed by the peer")),
            Some(Ok(_)) => Err(std::io::Error::other(
                "unexpected bytes on an idle connection",
            )),
            Some(Err(e)) => Err(e),
        }
    }

    fn has_broken(&self, conn: &mut Conn) -> bool {
        conn.broken
    }
}

impl PeerClient {
    pub fn new(
        connections_max: u32,
        timeout: Duration,
        tls: Option<Arc<rustls::ClientConfig>>,
        metrics: Arc<Metrics>,
    ) -> PeerClient {
        PeerClient {
            pools: Mutex::new(HashMap::new()),
            connections_max: connections_max.max(1),
            timeout,
            tls: tls.map(tokio_rustls::TlsConnector::from),
            metrics,
        }
    }

    fn pool(&self, addr: &str) -> bb8::Pool<Connector> {
        let mut pools = self.pools.lock().expect("not poisoned");
        pools
            .entry(addr.to_string())
            .or_insert_with(|| {
                bb8::Pool::builder()
                    .max_size(self.connections_max)
                    .connection_timeout(self.timeout)
                    .build_unchecked(Connector {
                        addr: addr.to_string(),
                        timeout: self.timeout,
                        tls: self.tls.clone(),
                    })
            })
            .clone()
    }

    /// One call: `args` writes the method's arguments struct, `result` reads its result
    /// struct. Every failure to reach the peer is `UNAVAILABLE` (retryable).
    async fn call<R>(
        &self,
        addr: &str,
        method: &'static str,
        args: impl FnOnce(&mut dyn TOutputProtocol) -> thrift::Result<()>,
        result: impl FnOnce(&mut dyn TInputProtocol) -> thrift::Result<R>,
    ) -> Result<R> {
        let r = self.call_once(addr, method, args, result).await;
        let outcome = match &r {
            Ok(_) => "ok",
            Err(_) => "unavailable",
        };
        self.metrics.forwarded(addr, method, outcome);
        r
    }

    async fn call_once<R>(
        &self,
        addr: &str,
        method: &'static str,
        args: impl FnOnce(&mut dyn TOutputProtocol) -> thrift::Result<()>,
        result: impl FnOnce(&mut dyn TInputProtocol) -> thrift::Result<R>,
    ) -> Result<R> {
        let unavailable = |why: String| Error::unavailable(format!("peer {addr}: {why}"));
        let doubt = |why: String| {
            Error::in_doubt(format!(
                "peer {addr}: {why}{}",
                crate::error::SENT_OUTCOME_UNKNOWN
            ))
        };
        let mut sent = false;
        let pool = self.pool(addr);
        let work = async {
            let mut conn = pool
                .get()
                .await
                .map_err(|e| unavailable(format!("{e:?}")))?;
            conn.seq = conn.seq.wrapping_add(1);
            let frame = encode(method, conn.seq, args).map_err(|e| unavailable(describe(&e)))?;
            conn.broken = true;
            // From the first byte written on, the peer may act on the call: a failure
            // is in doubt (the peer may have applied it), not a refusal.
            sent = true;
            conn.stream
                .write_all(&frame)
                .await
                .map_err(|e| doubt(e.to_string()))?;
            // TLS buffers what it encrypts: push it out.
            conn.stream
                .flush()
                .await
                .map_err(|e| doubt(e.to_string()))?;
            let len = conn
                .stream
                .read_i32()
                .await
                .map_err(|e| doubt(e.to_string()))?;
            if len <= 0 || len as usize > REPLY_FRAME_BYTES_MAX {
                return Err(doubt(format!("reply frame of {len} bytes")));
            }
            let mut reply = vec![0u8; len as usize];
            conn.stream
                .read_exact(&mut reply)
                .await
                .map_err(|e| doubt(e.to_string()))?;
            conn.broken = false;
            decode(&reply, result).map_err(|e| doubt(describe(&e)))
        };
        tokio::time::timeout(self.timeout, work)
            .await
            .map_err(|_| {
                let why = format!("no answer within {} ms", self.timeout.as_millis());
                if sent {
                    doubt(why)
                } else {
                    unavailable(why)
                }
            })?
    }
}

fn encode(
    method: &str,
    seq: i32,
    args: impl FnOnce(&mut dyn TOutputProtocol) -> thrift::Result<()>,
) -> thrift::Result<Vec<u8>> {
    let mut buf = vec![0u8; 4];
    {
        let mut o = TBinaryOutputProtocol::new(&mut buf, true);
        o.write_message_begin(&TMessageIdentifier::new(method, TMessageType::Call, seq))?;
        args(&mut o)?;
        o.write_message_end()?;
        o.flush()?;
    }
    let len = (buf.len() - 4) as i32;
    buf[..4].copy_from_slice(&len.to_be_bytes());
    Ok(buf)
}

fn decode<R>(
    frame: &[u8],
    result: impl FnOnce(&mut dyn TInputProtocol) -> thrift::Result<R>,
) -> thrift::Result<R> {
    let mut i = TBinaryInputProtocol::with_config(frame, true, config_for(frame.len()));
    let ident = i.read_message_begin()?;
    if ident.message_type == TMessageType::Exception {
        let e = thrift::Error::read_application_error_from_in_protocol(&mut i)?;
        return Err(thrift::Error::Application(e));
    }
    let r = result(&mut i)?;
    i.read_message_end()?;
    Ok(r)
}

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

/// A method's declared error, or its value.
/// A batched admin call's answer.
fn progress(v: t::DlqCountResponse) -> Progress {
    Progress {
        count: v.count.unwrap_or(0),
        more: v.more.unwrap_or(false),
    }
}

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
    ) -> BoxFuture<'a, Result<Vec<EnqueueOutcome>>> {
        let args = t::FoqsEnqueueArgs {
            req: t::EnqueueRequest {
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
    ) -> BoxFuture<'a, Result<Vec<Result<()>>>> {
        let args = t::FoqsNackArgs {
            req: t::NackRequest {
                items: Some(items.into_iter().map(convert::nack_item_to_wire).collect()),
                forwarded_by: Some(from.by.to_string()),
                forwarded_for: from.for_identity.map(str::to_string),
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
    ) -> BoxFuture<'a, Result<ActiveTopicsPage>> {
        let args = t::FoqsGetActiveTopicsArgs {
            req: t::GetActiveTopicsRequest {
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
    ) -> BoxFuture<'a, Result<Vec<Item>>> {
        let args = t::FoqsDequeueArgs {
            req: t::DequeueRequest {
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
    ) -> BoxFuture<'a, Result<Vec<Item>>> {
        let args = t::FoqsPeekArgs {
            req: t::PeekRequest {
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
    ) -> BoxFuture<'a, Result<(TopicSnapshot, i64)>> {
        let args = t::FoqsTopicStatsArgs {
            req: t::TopicStatsRequest {
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
    ) -> BoxFuture<'a, Result<(Vec<DeadItem>, Option<String>)>> {
        let args = t::FoqsDlqListArgs {
            req: t::DlqListRequest {
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
    ) -> BoxFuture<'a, Result<Progress>> {
        let args = t::FoqsDlqRequeueAllArgs {
            req: t::DlqRequeueAllRequest {
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
    ) -> BoxFuture<'a, Result<Progress>> {
        let args = t::FoqsDlqPurgeArgs {
            req: t::DlqPurgeRequest {
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
