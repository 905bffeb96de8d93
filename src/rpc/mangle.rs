//! Input for testing the decoder: a valid call of every method in both protocols, each
//! also as a connection's bytes in every transport ([`streams`]), and seeded mutations of
//! them (bytes flipped, truncated, lengths changed, bytes inserted, spliced, garbage).
//! Used by the randomized decoder test and the `cargo fuzz` target's corpus, so both
//! exercise the same shapes.

use thrift::protocol::{
    TBinaryOutputProtocol, TCompactOutputProtocol, TMessageIdentifier, TMessageType,
    TOutputProtocol,
};

use crate::thrift_gen as t;

pub use crate::seeded::Rng;

fn message(
    binary: bool,
    name: &str,
    write: impl Fn(&mut dyn TOutputProtocol) -> thrift::Result<()>,
) -> Vec<u8> {
    let mut out = Vec::new();
    let ident = TMessageIdentifier::new(name, TMessageType::Call, 1);
    let run = |o: &mut dyn TOutputProtocol| -> thrift::Result<()> {
        o.write_message_begin(&ident)?;
        write(o)?;
        o.write_message_end()?;
        o.flush()
    };
    if binary {
        run(&mut TBinaryOutputProtocol::new(&mut out, true))
    } else {
        run(&mut TCompactOutputProtocol::new(&mut out))
    }
    .expect("writing to a Vec cannot fail");
    out
}

/// A valid call of every method, in the binary and the compact protocol.
pub fn seeds() -> Vec<Vec<u8>> {
    let item = t::EnqueueItem {
        ns: Some("ns".into()),
        topic: Some("topic".into()),
        priority: Some(3),
        payload: Some(b"payload".to_vec()),
        metadata: Some(b"meta".to_vec()),
        deliver_after_ms: Some(1),
        lease_ms: Some(1000),
        ttl_ms: Some(60_000),
        policy: Some(t::DeliveryPolicy::AT_LEAST_ONCE),
        max_attempts: Some(3),
        dedup_key: Some("k".into()),
    };
    let topic = |ns: &str| t::TopicRequest {
        ns: Some(ns.into()),
        topic: Some("topic".into()),
        count: Some(5),
        before_priority: Some(3),
        before_deliver_after_ms: Some(1_000),
    };
    let mut out = Vec::new();
    for binary in [true, false] {
        let m = |name: &str, w: &dyn Fn(&mut dyn TOutputProtocol) -> thrift::Result<()>| {
            message(binary, name, w)
        };
        out.push(m("enqueue", &|o| {
            t::FoqsEnqueueArgs {
                req: t::EnqueueRequest {
                    forwarded_for: None,
                    items: Some(vec![item.clone(), item.clone()]),
                    forwarded_by: None,
                    forward_token: None,
                },
            }
            .write_to_out_protocol(o)
        }));
        out.push(m("dequeue", &|o| {
            t::FoqsDequeueArgs {
                req: t::DequeueRequest {
                    forwarded_for: None,
                    topics: Some(vec![topic("ns"), topic("other")]),
                    wait_ms: Some(10),
                    local_only: Some(false),
                    forwarded_by: None,
                },
            }
            .write_to_out_protocol(o)
        }));
        out.push(m("ack", &|o| {
            t::FoqsAckArgs {
                req: t::AckRequest {
                    ids: Some(vec!["0:1".into(), "1:2".into()]),
                    forwarded_by: None,
                    forwarded_for: None,
                    lease_ids: Some(vec![7, 0]),
                },
            }
            .write_to_out_protocol(o)
        }));
        out.push(m("nack", &|o| {
            t::FoqsNackArgs {
                req: t::NackRequest {
                    items: Some(vec![t::NackItem {
                        id: Some("0:1".into()),
                        delay_ms: Some(5),
                        metadata: Some(b"m".to_vec()),
                        to_dlq: Some(false),
                        lease_id: Some(7),
                    }]),
                    forwarded_by: Some("h".into()),
                    forwarded_for: Some("who".into()),
                    nack_token: Some(-9),
                },
            }
            .write_to_out_protocol(o)
        }));
        out.push(m("touch", &|o| {
            t::FoqsTouchArgs {
                req: t::TouchRequest {
                    items: Some(vec![t::TouchItem {
                        id: Some("0:1".into()),
                        extend_ms: Some(100),
                        lease_id: Some(7),
                    }]),
                    forwarded_by: None,
                    forwarded_for: None,
                },
            }
            .write_to_out_protocol(o)
        }));
        out.push(m("getActiveTopics", &|o| {
            t::FoqsGetActiveTopicsArgs {
                req: t::GetActiveTopicsRequest {
                    forwarded_for: None,
                    ns: Some("ns".into()),
                    limit: Some(10),
                    after: Some("a".into()),
                    local_only: Some(true),
                },
            }
            .write_to_out_protocol(o)
        }));
        out.push(m("getHostInfo", &|o| {
            t::FoqsGetHostInfoArgs {}.write_to_out_protocol(o)
        }));
        out.push(m("peek", &|o| {
            t::FoqsPeekArgs {
                req: t::PeekRequest {
                    forwarded_for: None,
                    ns: Some("ns".into()),
                    topic: Some("topic".into()),
                    count: Some(3),
                    local_only: Some(true),
                },
            }
            .write_to_out_protocol(o)
        }));
        out.push(m("topicStats", &|o| {
            t::FoqsTopicStatsArgs {
                req: t::TopicStatsRequest {
                    forwarded_for: None,
                    ns: Some("ns".into()),
                    topic: Some("topic".into()),
                    local_only: None,
                },
            }
            .write_to_out_protocol(o)
        }));
        out.push(m("dlqList", &|o| {
            t::FoqsDlqListArgs {
                req: t::DlqListRequest {
                    forwarded_for: None,
                    ns: Some("ns".into()),
                    topic: Some("topic".into()),
                    limit: Some(10),
                    after: Some("1:2:3:0".into()),
                    local_only: None,
                },
            }
            .write_to_out_protocol(o)
        }));
        out.push(m("dlqRequeue", &|o| {
            t::FoqsDlqRequeueArgs {
                req: t::DlqRequeueRequest {
                    ids: Some(vec!["0:1".into()]),
                    forwarded_by: None,
                    forwarded_for: None,
                    requeue_token: None,
                },
            }
            .write_to_out_protocol(o)
        }));
        out.push(m("dlqRequeueAll", &|o| {
            t::FoqsDlqRequeueAllArgs {
                req: t::DlqRequeueAllRequest {
                    forwarded_for: None,
                    ns: Some("ns".into()),
                    topic: Some("topic".into()),
                    max: Some(5),
                    local_only: None,
                },
            }
            .write_to_out_protocol(o)
        }));
        out.push(m("notifyReady", &|o| {
            t::FoqsNotifyReadyArgs {
                req: t::NotifyReadyRequest {
                    host_id: Some("h2".into()),
                    topics: Some(vec![t::ReadyTopic {
                        ns: Some("ns".into()),
                        topic: Some("topic".into()),
                        ready: Some(3),
                        head_priority: Some(-2),
                        head_deliver_after_ms: Some(1_000),
                        heads: Some(vec![t::HeadKey {
                            priority: Some(-2),
                            deliver_after_ms: Some(1_000),
                        }]),
                    }]),
                },
            }
            .write_to_out_protocol(o)
        }));
        out.push(m("enqueueOutcome", &|o| {
            t::FoqsEnqueueOutcomeArgs {
                req: t::EnqueueOutcomeRequest {
                    shards: Some(vec![0, 1, 7]),
                    forward_token: Some(1 << 40),
                    items: Some(3),
                    batch_token: None,
                },
            }
            .write_to_out_protocol(o)
        }));
        out.push(m("dlqPurge", &|o| {
            t::FoqsDlqPurgeArgs {
                req: t::DlqPurgeRequest {
                    forwarded_for: None,
                    ns: Some("ns".into()),
                    topic: Some("topic".into()),
                    local_only: None,
                },
            }
            .write_to_out_protocol(o)
        }));
    }
    out
}

/// Every seed call as a connection's input in every transport: framed; unframed (and two
/// pipelined); THeader in its protocol (compact as fbthrift's version 2), with info
/// headers of both kinds and with zlib; HTTP.
pub fn streams() -> Vec<Vec<u8>> {
    use crate::wire::{header, Envelope, Protocol};
    let mut out = Vec::new();
    for call in seeds() {
        let protocol = Protocol::detect(&call).expect("a seed is binary or compact");
        out.push(Envelope::Framed.wrap(&call));
        out.push(call.clone());
        out.push([&call[..], &call[..]].concat());
        let mut v2 = call.clone();
        if protocol == Protocol::Compact {
            v2[1] = (v2[1] & 0xe0) | 2;
        }
        for zlib in [false, true] {
            let reply = header::Reply {
                seq_id: 7,
                flags: 1,
                proto: protocol,
                zlib,
            };
            out.push(header::frame(&reply, &v2));
        }
        out.push(header_with_info(protocol, &v2));
        let mut post = format!(
            "POST / HTTP/1.1\r\nHost: foqs\r\nContent-Type: application/x-thrift\r\nContent-Length: {}\r\n\r\n",
            call.len()
        )
        .into_bytes();
        post.extend_from_slice(&call);
        out.push(post);
    }
    out
}

/// A THeader frame as fbthrift writes one: flags 1, sequence id 7, a persistent key/value
/// block before a key/value block, padding to the header size.
pub fn header_with_info(protocol: crate::wire::Protocol, msg: &[u8]) -> Vec<u8> {
    let kv = |out: &mut Vec<u8>, k: &str, v: &str| {
        out.push(k.len() as u8);
        out.extend_from_slice(k.as_bytes());
        out.push(v.len() as u8);
        out.extend_from_slice(v.as_bytes());
    };
    let mut h = vec![
        if protocol == crate::wire::Protocol::Compact {
            2
        } else {
            0
        },
        0,
    ];
    h.extend_from_slice(&[2, 1]);
    kv(&mut h, "client_id", "fbthrift-go");
    h.extend_from_slice(&[1, 2]);
    kv(&mut h, "client_timeout", "5000");
    kv(&mut h, "thrift_priority", "HIGH");
    h.resize(h.len().div_ceil(4) * 4, 0);
    let mut f = vec![0x0f, 0xff, 0x00, 0x01, 0, 0, 0, 7];
    f.extend_from_slice(&((h.len() / 4) as u16).to_be_bytes());
    f.extend_from_slice(&h);
    f.extend_from_slice(msg);
    let mut out = (f.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&f);
    out
}

/// The reply message inside `bytes`, written to a request that came in `envelope`, and
/// its protocol; an error when the framing is wrong. For checking every reply.
pub fn reply_message(
    envelope: &crate::wire::Envelope,
    bytes: &[u8],
) -> Result<(crate::wire::Protocol, Vec<u8>), String> {
    use crate::wire::{header, Envelope, Protocol};
    let body = match envelope {
        Envelope::Framed => {
            let len = bytes.get(..4).ok_or("no frame length")?;
            let n = u32::from_be_bytes(len.try_into().unwrap()) as usize;
            if n + 4 != bytes.len() {
                return Err(format!("frame length {n} for {} bytes", bytes.len()));
            }
            bytes[4..].to_vec()
        }
        Envelope::Unframed => bytes.to_vec(),
        Envelope::Header(want) => {
            let r = header::parse(bytes.get(4..).ok_or("short")?, usize::MAX >> 1)
                .map_err(|e| format!("{e:?}"))?;
            if r.reply != *want {
                return Err(format!("reply header {:?}, request's {want:?}", r.reply));
            }
            match r.payload {
                header::Payload::Slice(s) => bytes[4 + s.start..4 + s.end].to_vec(),
                header::Payload::Owned(v) => v,
            }
        }
        Envelope::Http(_) => {
            let at = bytes
                .windows(4)
                .position(|w| w == b"\r\n\r\n")
                .ok_or("no end of the HTTP head")?;
            if !bytes.starts_with(b"HTTP/1.1 200 OK\r\n") {
                return Err("not a 200".into());
            }
            bytes[at + 4..].to_vec()
        }
    };
    let protocol = Protocol::detect(&body).ok_or("reply in no protocol")?;
    Ok((protocol, body))
}

const INTERESTING: [i32; 8] = [0, 1, -1, 127, 0x7fff, 0x7fff_ffff, i32::MIN, 1 << 20];

/// One mutation of a seed (or garbage).
pub fn mangle(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut f = seeds[rng.below(seeds.len())].clone();
    let kind = rng.below(7);
    match kind {
        // Flip a few bytes.
        0 => {
            for _ in 0..1 + rng.below(4) {
                let i = rng.below(f.len());
                f[i] = rng.next_u64() as u8;
            }
        }
        // Truncate.
        1 => f.truncate(rng.below(f.len())),
        // A length, count or field header changed to an interesting value.
        2 if f.len() >= 4 => {
            let i = rng.below(f.len() - 3);
            let v = INTERESTING[rng.below(INTERESTING.len())].to_be_bytes();
            f[i..i + 4].copy_from_slice(&v);
        }
        // Bytes inserted.
        3 => {
            let i = rng.below(f.len());
            let n = 1 + rng.below(16);
            let extra: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            f.splice(i..i, extra);
        }
        // Two seeds spliced.
        4 => {
            let other = &seeds[rng.below(seeds.len())];
            let cut = rng.below(f.len());
            f.truncate(cut);
            f.extend_from_slice(&other[rng.below(other.len())..]);
        }
        // Garbage behind a protocol's or a transport's first bytes.
        5 => {
            const STARTS: [&[u8]; 5] = [
                &[0x80],
                &[0x82],
                &[0x80, 0x01, 0x00, 0x01],
                &[0x00, 0x00, 0x00, 0x20, 0x0f, 0xff],
                b"POST / HTTP/1.1\r\n",
            ];
            let n = rng.below(64);
            f = STARTS[rng.below(STARTS.len())].to_vec();
            f.extend((0..n).map(|_| rng.next_u64() as u8));
        }
        // Several of the above.
        _ => {
            for _ in 0..2 + rng.below(3) {
                let i = rng.below(f.len().max(1));
                if i < f.len() {
                    f[i] ^= 1 << rng.below(8);
                }
            }
        }
    }
    f
}
