//! The Thrift edge, and the only code that sees generated types: decode one message from a
//! frame, call [`crate::core::Host`], encode the reply. Decoding and encoding are
//! synchronous over byte slices, so no protocol object lives across an `.await`.
//!
//! Errors on the wire: an unknown method gets `TApplicationException(UNKNOWN_METHOD)`,
//! undecodable arguments `TApplicationException(PROTOCOL_ERROR)` with the decoder's message,
//! a domain failure the method's declared `FoqsError`. The connection stays usable after
//! each; only a frame whose message header cannot be read at all closes it.

mod bounded;
pub mod client;
mod convert;
mod execute;
/// Test support (seeded inputs for the decoder tests and the fuzz target): only in tests
/// and builds with the `faults` feature, never in a release binary.
#[cfg(any(test, feature = "faults"))]
pub mod mangle;
mod peer;
mod peer_conn;
mod replication;
pub mod worker;

pub use peer_conn::{PeerClient, PeerLogin};

use thrift::protocol::{
    TBinaryInputProtocol, TBinaryOutputProtocol, TCompactInputProtocol, TCompactOutputProtocol,
    TInputProtocol, TMessageIdentifier, TMessageType, TOutputProtocol, TType,
};
use thrift::{ApplicationError, ApplicationErrorKind, TConfiguration};

use crate::core::{Caller, Host};
use crate::thrift_gen as t;

/// Most elements a list in a request may declare. Requests carry at most 1000 items, and
/// the generated decoder reserves a list's declared length up front, so this bounds what a
/// hostile length can make it allocate.
const CONTAINER_ELEMENTS_MAX: usize = 10_000;

pub use crate::wire::Protocol;

/// The compact protocol version fbthrift writes (1 is Apache's; 2 differs only in
/// doubles, which foqs's IDL has none of). fbthrift's reader refuses a version 1 reply to
/// a version 2 call, so the reply is written in the call's version.
const COMPACT_VERSION_FBTHRIFT: u8 = 2;

/// What to do with a frame.
#[derive(Debug)]
pub enum Outcome {
    /// Send this message (without the frame length).
    Reply(Vec<u8>),
    /// The frame is not a Thrift message we can answer: close the connection.
    Close(String),
}

enum Call {
    Enqueue(t::EnqueueRequest),
    Dequeue(t::DequeueRequest),
    Ack(t::AckRequest),
    Nack(t::NackRequest),
    GetActiveTopics(t::GetActiveTopicsRequest),
    GetHostInfo,
    Touch(t::TouchRequest),
    Peek(t::PeekRequest),
    TopicStats(t::TopicStatsRequest),
    DlqList(t::DlqListRequest),
    DlqRequeue(t::DlqRequeueRequest),
    DlqRequeueAll(t::DlqRequeueAllRequest),
    DlqPurge(t::DlqPurgeRequest),
    NotifyReady(t::NotifyReadyRequest),
    EnqueueOutcome(t::EnqueueOutcomeRequest),
    PeerLogin(t::PeerLoginRequest),
    Replication(replication::Call),
    /// A call only hosts make, from a caller that is not one (arguments not read).
    NotPeer(PeerOnly),
}

/// The calls only hosts of a cluster make.
#[derive(Debug, Clone, Copy)]
enum PeerOnly {
    NotifyReady,
    EnqueueOutcome,
}

impl PeerOnly {
    fn of(method: &str) -> Option<PeerOnly> {
        match method {
            "notifyReady" => Some(PeerOnly::NotifyReady),
            "enqueueOutcome" => Some(PeerOnly::EnqueueOutcome),
            _ => None,
        }
    }

    fn method(self) -> &'static str {
        match self {
            PeerOnly::NotifyReady => "notifyReady",
            PeerOnly::EnqueueOutcome => "enqueueOutcome",
        }
    }
}

enum Reply {
    Enqueue(t::FoqsEnqueueResult),
    Dequeue(t::FoqsDequeueResult),
    Ack(t::FoqsAckResult),
    Nack(t::FoqsNackResult),
    GetActiveTopics(t::FoqsGetActiveTopicsResult),
    GetHostInfo(t::FoqsGetHostInfoResult),
    Touch(t::FoqsTouchResult),
    Peek(t::FoqsPeekResult),
    TopicStats(t::FoqsTopicStatsResult),
    DlqList(t::FoqsDlqListResult),
    DlqRequeue(t::FoqsDlqRequeueResult),
    DlqRequeueAll(t::FoqsDlqRequeueAllResult),
    DlqPurge(t::FoqsDlqPurgeResult),
    NotifyReady(t::FoqsNotifyReadyResult),
    EnqueueOutcome(t::FoqsEnqueueOutcomeResult),
    PeerLogin(t::FoqsPeerLoginResult),
    Replication(replication::Reply),
    Exception(ApplicationError),
}

/// Formats a Thrift error with its message: the crate's `Display` drops it for some kinds.
fn describe(e: &thrift::Error) -> String {
    match e {
        thrift::Error::Protocol(p) => format!("protocol error ({:?}): {}", p.kind, p.message),
        thrift::Error::Transport(t) => format!("transport error ({:?}): {}", t.kind, t.message),
        thrift::Error::Application(a) => format!("application error ({:?}): {}", a.kind, a.message),
        thrift::Error::User(u) => format!("error: {u}"),
    }
}

fn config_for(frame_len: usize) -> TConfiguration {
    TConfiguration::builder()
        .max_message_size(Some(frame_len))
        .max_frame_size(Some(frame_len))
        .max_string_size(Some(frame_len))
        .max_container_size(Some(CONTAINER_ELEMENTS_MAX))
        .build()
        .expect("frame size equals message size")
}

/// Reads `msg` as one whole message of `protocol` and returns its type; for tests and
/// fuzzing, which check that every reply is well-formed.
#[doc(hidden)]
pub fn check_reply(protocol: Protocol, msg: &[u8]) -> thrift::Result<TMessageType> {
    let cfg = config_for(msg.len());
    let msg = &as_compact_v1(protocol, msg);
    let mut i: Box<dyn TInputProtocol> = match protocol {
        Protocol::Binary => Box::new(TBinaryInputProtocol::with_config(&msg[..], true, cfg)),
        Protocol::Compact => Box::new(TCompactInputProtocol::with_config(&msg[..], cfg)),
    };
    let ident = i.read_message_begin()?;
    i.skip(TType::Struct)?;
    i.read_message_end()?;
    Ok(ident.message_type)
}

/// The version of a compact message (its second byte's low five bits).
fn compact_version(msg: &[u8]) -> u8 {
    msg.get(1).map_or(1, |b| b & 0x1f)
}

/// `msg` as the Thrift crate reads it: a compact version 2 message (fbthrift's) with its
/// version byte set to 1; the rest is the same bytes.
fn as_compact_v1(protocol: Protocol, msg: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    if protocol == Protocol::Compact && compact_version(msg) == COMPACT_VERSION_FBTHRIFT {
        let mut v = msg.to_vec();
        v[1] = (v[1] & 0xe0) | 1;
        std::borrow::Cow::Owned(v)
    } else {
        std::borrow::Cow::Borrowed(msg)
    }
}

/// Answers one message from `caller`. `client_timeout_ms` (THeader's `client_timeout`)
/// bounds how long a long poll may wait.
pub async fn handle(
    msg: &[u8],
    host: &Host,
    caller: &Caller,
    client_timeout_ms: Option<u64>,
) -> Outcome {
    let Some(protocol) = Protocol::detect(msg) else {
        return Outcome::Close(format!(
            "message starts with 0x{:02x}: neither binary (0x80, or 0x00 unversioned) nor compact (0x82) protocol",
            msg.first().copied().unwrap_or(0)
        ));
    };
    let version = compact_version(msg);
    let peer = host.is_peer(caller);
    // A large message is decoded on a blocking thread, so that decoding it does not hold
    // a runtime worker (every other connection's progress) for its whole length.
    let decoded = if msg.len() > DECODE_INLINE_BYTES_MAX {
        let owned = msg.to_vec();
        tokio::task::spawn_blocking(move || decode_message(protocol, &owned, peer))
            .await
            .unwrap_or_else(|e| Err(format!("decoding failed: {e}")))
    } else {
        decode_message(protocol, msg, peer)
    };
    let (ident, call) = match decoded {
        Ok(d) => d,
        Err(why) => return Outcome::Close(why),
    };
    let started = std::time::Instant::now();
    let reply = match call {
        Ok(call) => execute::execute(call, host, caller, client_timeout_ms).await,
        Err(e) => Reply::Exception(e),
    };
    host.metrics().request(
        method_label(&ident.name),
        reply.code(),
        started.elapsed().as_secs_f64(),
    );
    match write_reply(protocol, version, &ident, &reply) {
        Ok(out) => Outcome::Reply(out),
        Err(e) => Outcome::Close(format!(
            "cannot encode the reply to {}: {}",
            ident.name,
            describe(&e)
        )),
    }
}

/// Messages up to this size are decoded on the runtime's thread (a 1,000-item enqueue of
/// small items is well under it); larger ones on a blocking thread.
const DECODE_INLINE_BYTES_MAX: usize = 256 * 1024;

/// Reads one whole message of `protocol`: its header, then its arguments, the elements of
/// all their containers within the caller's bound (see [`bounded`]).
#[allow(clippy::type_complexity)]
fn decode_message(
    protocol: Protocol,
    msg: &[u8],
    peer: bool,
) -> Result<(TMessageIdentifier, Result<Call, ApplicationError>), String> {
    let input = as_compact_v1(protocol, msg);
    let cfg = config_for(msg.len());
    let elements = if peer {
        bounded::PEER_ELEMENTS_MAX
    } else {
        bounded::CLIENT_ELEMENTS_MAX
    };
    // Binary is read non-strict: that accepts strict (versioned) messages and those of
    // older, non-strict writers. Replies are always strict, which every reader accepts.
    match protocol {
        Protocol::Binary => {
            let mut raw = TBinaryInputProtocol::with_config(&input[..], false, cfg);
            decode(&mut bounded::Bounded::new(&mut raw, elements), peer)
        }
        Protocol::Compact => {
            let mut raw = TCompactInputProtocol::with_config(&input[..], cfg);
            decode(&mut bounded::Bounded::new(&mut raw, elements), peer)
        }
    }
}

/// A `TApplicationException` answering a message that could not be read (named `""`,
/// with sequence id `seq_id`: THeader clients match it by the header's id).
pub fn exception(
    protocol: Protocol,
    seq_id: i32,
    kind: ApplicationErrorKind,
    message: String,
) -> Vec<u8> {
    let ident = TMessageIdentifier::new("", TMessageType::Exception, seq_id);
    let reply = Reply::Exception(ApplicationError::new(kind, message));
    let version = match protocol {
        Protocol::Compact => COMPACT_VERSION_FBTHRIFT,
        Protocol::Binary => 1,
    };
    write_reply(protocol, version, &ident, &reply).expect("writing to a Vec cannot fail")
}

fn write_reply(
    protocol: Protocol,
    compact_version: u8,
    ident: &TMessageIdentifier,
    reply: &Reply,
) -> thrift::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(reply.size_hint());
    match protocol {
        Protocol::Binary => encode(
            &mut TBinaryOutputProtocol::new(&mut out, true),
            ident,
            reply,
        )?,
        Protocol::Compact => {
            encode(&mut TCompactOutputProtocol::new(&mut out), ident, reply)?;
            if compact_version == COMPACT_VERSION_FBTHRIFT {
                out[1] = (out[1] & 0xe0) | COMPACT_VERSION_FBTHRIFT;
            }
        }
    }
    Ok(out)
}

/// Reads the message header and the arguments. `Err` only when not even the header could
/// be read; argument and method problems become an `ApplicationError` to send back.
#[allow(clippy::type_complexity)]
fn decode(
    i: &mut dyn TInputProtocol,
    peer: bool,
) -> Result<(TMessageIdentifier, Result<Call, ApplicationError>), String> {
    let ident = i
        .read_message_begin()
        .map_err(|e| format!("unreadable message header: {}", describe(&e)))?;
    if ident.message_type != TMessageType::Call {
        let e = ApplicationError::new(
            ApplicationErrorKind::InvalidMessageType,
            format!("expected a call, got {:?}", ident.message_type),
        );
        return Ok((ident, Err(e)));
    }
    let protocol_error =
        |e: thrift::Error| ApplicationError::new(ApplicationErrorKind::ProtocolError, describe(&e));
    // Calls only hosts make are refused before their arguments are read: a client's would
    // cost the decoding of whatever it sent.
    if !peer {
        if let Some(only) = PeerOnly::of(&ident.name) {
            return Ok((ident, Ok(Call::NotPeer(only))));
        }
    }
    let call = match ident.name.as_str() {
        "enqueue" => t::FoqsEnqueueArgs::read_from_in_protocol(i).map(|a| Call::Enqueue(a.req)),
        "dequeue" => t::FoqsDequeueArgs::read_from_in_protocol(i).map(|a| Call::Dequeue(a.req)),
        "ack" => t::FoqsAckArgs::read_from_in_protocol(i).map(|a| Call::Ack(a.req)),
        "nack" => t::FoqsNackArgs::read_from_in_protocol(i).map(|a| Call::Nack(a.req)),
        "getActiveTopics" => t::FoqsGetActiveTopicsArgs::read_from_in_protocol(i)
            .map(|a| Call::GetActiveTopics(a.req)),
        "getHostInfo" => {
            t::FoqsGetHostInfoArgs::read_from_in_protocol(i).map(|_| Call::GetHostInfo)
        }
        "touch" => t::FoqsTouchArgs::read_from_in_protocol(i).map(|a| Call::Touch(a.req)),
        "peek" => t::FoqsPeekArgs::read_from_in_protocol(i).map(|a| Call::Peek(a.req)),
        "topicStats" => {
            t::FoqsTopicStatsArgs::read_from_in_protocol(i).map(|a| Call::TopicStats(a.req))
        }
        "dlqList" => t::FoqsDlqListArgs::read_from_in_protocol(i).map(|a| Call::DlqList(a.req)),
        "dlqRequeue" => {
            t::FoqsDlqRequeueArgs::read_from_in_protocol(i).map(|a| Call::DlqRequeue(a.req))
        }
        "dlqRequeueAll" => {
            t::FoqsDlqRequeueAllArgs::read_from_in_protocol(i).map(|a| Call::DlqRequeueAll(a.req))
        }
        "dlqPurge" => t::FoqsDlqPurgeArgs::read_from_in_protocol(i).map(|a| Call::DlqPurge(a.req)),
        "notifyReady" => {
            t::FoqsNotifyReadyArgs::read_from_in_protocol(i).map(|a| Call::NotifyReady(a.req))
        }
        "enqueueOutcome" => {
            t::FoqsEnqueueOutcomeArgs::read_from_in_protocol(i).map(|a| Call::EnqueueOutcome(a.req))
        }
        "peerLogin" => {
            t::FoqsPeerLoginArgs::read_from_in_protocol(i).map(|a| Call::PeerLogin(a.req))
        }
        other if replication::METHODS.contains(&other) => replication::decode(other, i)
            .expect("a replication method")
            .map(Call::Replication),
        other => {
            let _ = i.skip(TType::Struct);
            let e = ApplicationError::new(
                ApplicationErrorKind::UnknownMethod,
                format!("unknown method {other}"),
            );
            return Ok((ident, Err(e)));
        }
    };
    let call = call
        .and_then(|c| i.read_message_end().map(|_| c))
        .map_err(protocol_error);
    Ok((ident, call))
}

fn encode(
    o: &mut dyn TOutputProtocol,
    ident: &TMessageIdentifier,
    reply: &Reply,
) -> thrift::Result<()> {
    let kind = match reply {
        Reply::Exception(_) => TMessageType::Exception,
        _ => TMessageType::Reply,
    };
    o.write_message_begin(&TMessageIdentifier::new(
        ident.name.clone(),
        kind,
        ident.sequence_number,
    ))?;
    match reply {
        Reply::Enqueue(r) => r.write_to_out_protocol(o)?,
        Reply::Dequeue(r) => r.write_to_out_protocol(o)?,
        Reply::Ack(r) => r.write_to_out_protocol(o)?,
        Reply::Nack(r) => r.write_to_out_protocol(o)?,
        Reply::GetActiveTopics(r) => r.write_to_out_protocol(o)?,
        Reply::GetHostInfo(r) => r.write_to_out_protocol(o)?,
        Reply::Touch(r) => r.write_to_out_protocol(o)?,
        Reply::Peek(r) => r.write_to_out_protocol(o)?,
        Reply::TopicStats(r) => r.write_to_out_protocol(o)?,
        Reply::DlqList(r) => r.write_to_out_protocol(o)?,
        Reply::DlqRequeue(r) => r.write_to_out_protocol(o)?,
        Reply::DlqRequeueAll(r) => r.write_to_out_protocol(o)?,
        Reply::DlqPurge(r) => r.write_to_out_protocol(o)?,
        Reply::NotifyReady(r) => r.write_to_out_protocol(o)?,
        Reply::EnqueueOutcome(r) => r.write_to_out_protocol(o)?,
        Reply::PeerLogin(r) => r.write_to_out_protocol(o)?,
        Reply::Replication(r) => r.write(o)?,
        Reply::Exception(e) => thrift::Error::write_application_error_to_out_protocol(e, o)?,
    }
    o.write_message_end()?;
    o.flush()
}

/// The method as a metrics label: only the API's names, so a client cannot grow the
/// label set.
fn method_label(name: &str) -> &'static str {
    const METHODS: [&str; 16] = [
        "enqueue",
        "dequeue",
        "ack",
        "nack",
        "getActiveTopics",
        "getHostInfo",
        "touch",
        "peek",
        "topicStats",
        "dlqList",
        "dlqRequeue",
        "dlqRequeueAll",
        "dlqPurge",
        "notifyReady",
        "enqueueOutcome",
        "peerLogin",
    ];
    METHODS
        .iter()
        .chain(&replication::METHODS)
        .find(|m| **m == name)
        .copied()
        .unwrap_or("unknown")
}

/// The name of an error code, as a metrics label.
fn code_label(e: &t::FoqsError) -> &'static str {
    match e.code.map(|c| c.0) {
        Some(1) => "INVALID_ARGUMENT",
        Some(2) => "PAYLOAD_TOO_LARGE",
        Some(3) => "RATE_LIMITED",
        Some(4) => "UNAVAILABLE",
        Some(5) => "NOT_FOUND",
        Some(6) => "WRONG_HOST",
        Some(7) => "UNKNOWN_NAMESPACE",
        Some(9) => "PERMISSION_DENIED",
        _ => "INTERNAL",
    }
}

impl Reply {
    /// About how many bytes the reply encodes to: a dequeue's items, whatever their
    /// number, are written into one buffer of the right size instead of one that doubles
    /// (and is copied) as it grows.
    fn size_hint(&self) -> usize {
        match self {
            Reply::Dequeue(r) => r
                .result_value
                .as_ref()
                .and_then(|v| v.items.as_ref())
                .map_or(256, |items| {
                    items
                        .iter()
                        .map(|i| {
                            let text = |s: &Option<String>| s.as_ref().map_or(0, String::len);
                            i.payload.as_ref().map_or(0, Vec::len)
                                + i.metadata.as_ref().map_or(0, Vec::len)
                                + text(&i.ns)
                                + text(&i.topic)
                                + text(&i.id)
                                + 128
                        })
                        .sum::<usize>()
                        + 64
                }),
            _ => 256,
        }
    }

    /// The outcome as a metrics label: `ok`, the declared error's code, or the kind of
    /// Thrift exception.
    fn code(&self) -> &'static str {
        let err = match self {
            Reply::Enqueue(r) => r.err.as_ref(),
            Reply::Dequeue(r) => r.err.as_ref(),
            Reply::Ack(r) => r.err.as_ref(),
            Reply::Nack(r) => r.err.as_ref(),
            Reply::GetActiveTopics(r) => r.err.as_ref(),
            Reply::GetHostInfo(r) => r.err.as_ref(),
            Reply::Touch(r) => r.err.as_ref(),
            Reply::Peek(r) => r.err.as_ref(),
            Reply::TopicStats(r) => r.err.as_ref(),
            Reply::DlqList(r) => r.err.as_ref(),
            Reply::DlqRequeue(r) => r.err.as_ref(),
            Reply::DlqRequeueAll(r) => r.err.as_ref(),
            Reply::DlqPurge(r) => r.err.as_ref(),
            Reply::NotifyReady(r) => r.err.as_ref(),
            Reply::EnqueueOutcome(r) => r.err.as_ref(),
            Reply::PeerLogin(r) => r.err.as_ref(),
            Reply::Replication(r) => r.err(),
            Reply::Exception(e) => {
                return match e.kind {
                    ApplicationErrorKind::UnknownMethod => "UNKNOWN_METHOD",
                    _ => "PROTOCOL_ERROR",
                }
            }
        };
        err.map_or("ok", code_label)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A full dequeue reply (1,000 items of 10 KiB, long names) is encoded into a buffer
    /// allocated once at its size: no regrowth, so no copy of the items while encoding.
    #[test]
    fn a_dequeue_reply_is_encoded_into_one_buffer_of_its_size() {
        let item = |n: usize| t::Item {
            id: Some(format!("12:{n}")),
            ns: Some("n".repeat(255)),
            topic: Some("t".repeat(255)),
            priority: Some(i32::MIN),
            payload: Some(vec![7; 10 * 1024]),
            metadata: Some(vec![1; 4 * 1024]),
            lease_id: Some(i64::MAX),
            ..t::Item::default()
        };
        let reply = Reply::Dequeue(t::FoqsDequeueResult {
            result_value: Some(t::DequeueResponse {
                items: Some((0..1000).map(item).collect()),
            }),
            err: None,
        });
        let ident = TMessageIdentifier::new("dequeue", thrift::protocol::TMessageType::Reply, 1);
        for protocol in [Protocol::Binary, Protocol::Compact] {
            let out = write_reply(protocol, 1, &ident, &reply).unwrap();
            assert!(
                out.len() <= reply.size_hint(),
                "{protocol:?}: {} bytes",
                out.len()
            );
            assert_eq!(out.capacity(), reply.size_hint(), "{protocol:?}: regrown");
        }
    }
}
