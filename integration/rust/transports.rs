//! Every transport a Thrift client may default to, on the one port: THeader frames built by
//! hand the way fbthrift writes them (flags 1, header sequence id 7, message sequence id
//! 0, compact version 2, a persistent key/value block before a key/value block,
//! `upgradeToRocket` first, zlib), unframed calls from strict and non-strict writers
//! (pipelined), Thrift over HTTP with keep-alive, the Rust client over each transport,
//! and bad input of each kind answered or closed at once while other connections are
//! served.

use crate::common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::*;
use foqs::client::{connect_via, ClientTransport};
use foqs::thrift_gen::*;
use thrift::protocol::{
    TBinaryInputProtocol, TBinaryOutputProtocol, TCompactInputProtocol, TCompactOutputProtocol,
    TInputProtocol, TMessageIdentifier, TMessageType, TOutputProtocol,
};
use thrift::ApplicationErrorKind;

mod streams;

const MAX_FRAME: usize = 64 * 1024;

async fn server() -> TestServer {
    TestServer::start_full(
        TestDb::new(2),
        &format!("max_frame_bytes = {MAX_FRAME}"),
        &format!("{FAST_ENGINE}[metrics]\nlisten = \"127.0.0.1:0\"\n"),
    )
    .await
}

fn raw(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// A call message; compact calls are patched to version 2, as fbthrift writes them.
fn call(
    compact: bool,
    name: &str,
    seq: i32,
    args: impl FnOnce(&mut dyn TOutputProtocol) -> thrift::Result<()>,
) -> Vec<u8> {
    let mut out = Vec::new();
    {
        let ident = TMessageIdentifier::new(name, TMessageType::Call, seq);
        let mut o: Box<dyn TOutputProtocol + '_> = if compact {
            Box::new(TCompactOutputProtocol::new(&mut out))
        } else {
            Box::new(TBinaryOutputProtocol::new(&mut out, true))
        };
        o.write_message_begin(&ident).unwrap();
        args(&mut *o).unwrap();
        o.write_message_end().unwrap();
        o.flush().unwrap();
    }
    if compact {
        out[1] = (out[1] & 0xe0) | 2;
    }
    out
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn kv_block(out: &mut Vec<u8>, kind: u64, pairs: &[(&str, &str)]) {
    varint(out, kind);
    varint(out, pairs.len() as u64);
    for (k, v) in pairs {
        varint(out, k.len() as u64);
        out.extend_from_slice(k.as_bytes());
        varint(out, v.len() as u64);
        out.extend_from_slice(v.as_bytes());
    }
}

/// An fbthrift-style THeader frame: flags 1, header sequence id 7, protocol `proto_id`,
/// the given transforms, a persistent key/value block then a key/value block, padded.
fn fb_frame(proto_id: u64, transforms: &[u64], body: &[u8]) -> Vec<u8> {
    let info: [(u64, &[(&str, &str)]); 2] = [
        (2, &[("client_id", "fbthrift-go")]),
        (
            1,
            &[
                ("client_timeout", "2000"),
                ("thrift_priority", "HIGH"),
                ("client_metadata", "{\"agent\":\"test\"}"),
            ],
        ),
    ];
    fb_frame_with(proto_id, transforms, &info, body)
}

/// [`fb_frame`] with the given info blocks (kind 1 key/value, 2 persistent).
fn fb_frame_with(
    proto_id: u64,
    transforms: &[u64],
    info: &[(u64, &[(&str, &str)])],
    body: &[u8],
) -> Vec<u8> {
    let mut h = Vec::new();
    varint(&mut h, proto_id);
    varint(&mut h, transforms.len() as u64);
    for t in transforms {
        varint(&mut h, *t);
    }
    for (kind, pairs) in info {
        kv_block(&mut h, *kind, pairs);
    }
    h.resize(h.len().div_ceil(4) * 4, 0);
    let mut f = vec![0x0f, 0xff, 0x00, 0x01, 0, 0, 0, 7];
    f.extend_from_slice(&((h.len() / 4) as u16).to_be_bytes());
    f.extend_from_slice(&h);
    f.extend_from_slice(body);
    let mut out = (f.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&f);
    out
}

fn zlib(b: &[u8]) -> Vec<u8> {
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    z.write_all(b).unwrap();
    z.finish().unwrap()
}

fn unzlib(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::ZlibDecoder::new(b)
        .read_to_end(&mut out)
        .unwrap();
    out
}

/// Reads one THeader reply and checks what fbthrift's client checks: the header's
/// sequence id and flags echoed, compact version 2. Returns (transforms, payload).
fn read_fb_reply(s: &mut TcpStream) -> (Vec<u8>, Vec<u8>) {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    let mut f = vec![0; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut f).unwrap();
    assert_eq!(&f[..2], &[0x0f, 0xff], "THeader magic");
    assert_eq!(u16::from_be_bytes([f[2], f[3]]), 1, "the request's flags");
    assert_eq!(
        u32::from_be_bytes(f[4..8].try_into().unwrap()),
        7,
        "the header sequence id"
    );
    let header_end = 10 + 4 * u16::from_be_bytes([f[8], f[9]]) as usize;
    let h = &f[10..header_end];
    assert_eq!(h[0], 2, "compact protocol id");
    let transforms = h[2..2 + h[1] as usize].to_vec();
    let body = &f[header_end..];
    let payload = if transforms.contains(&1) {
        unzlib(body)
    } else {
        body.to_vec()
    };
    assert_eq!(payload[0], 0x82);
    assert_eq!(payload[1] & 0x1f, 2, "answered in compact version 2");
    (transforms, payload)
}

/// A compact version 2 reply as the Thrift crate reads it (version 1; nothing else differs
/// without doubles).
fn as_v1(payload: &[u8]) -> Vec<u8> {
    let mut v = payload.to_vec();
    v[1] = (v[1] & 0xe0) | 1;
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fbthrift_style_header_frames_get_what_an_fbthrift_client_checks() {
    let srv = server().await;
    let mut s = raw(srv.addr);
    let ns = "fb";
    let topic = "header";
    tokio::task::block_in_place(|| {
        // 1. upgradeToRocket: UNKNOWN_METHOD, sequence ids kept, the connection stays.
        let up = call(true, "upgradeToRocket", 0, |o| {
            o.write_struct_begin(&thrift::protocol::TStructIdentifier::new("args"))?;
            o.write_field_stop()?;
            o.write_struct_end()
        });
        s.write_all(&fb_frame(2, &[], &up)).unwrap();
        let (_, payload) = read_fb_reply(&mut s);
        let v1 = as_v1(&payload);
        let mut i = TCompactInputProtocol::new(&v1[..]);
        let ident = i.read_message_begin().unwrap();
        assert_eq!(
            (
                ident.name.as_str(),
                ident.message_type,
                ident.sequence_number
            ),
            ("upgradeToRocket", TMessageType::Exception, 0)
        );
        let e = thrift::Error::read_application_error_from_in_protocol(&mut i).unwrap();
        assert_eq!(e.kind, ApplicationErrorKind::UnknownMethod);

        // 2. enqueue two items on the same connection.
        let enq = call(true, "enqueue", 0, |o| {
            FoqsEnqueueArgs {
                req: EnqueueRequest {
                    forwarded_for: None,
                    items: Some(vec![
                        item(ns, topic, 5, b"later"),
                        item(ns, topic, 1, b"first"),
                    ]),
                    forwarded_by: None,
                    forward_token: None,
                },
            }
            .write_to_out_protocol(o)
        });
        s.write_all(&fb_frame(2, &[], &enq)).unwrap();
        let (transforms, payload) = read_fb_reply(&mut s);
        assert!(transforms.is_empty(), "no transform on a plain request");
        let v1 = as_v1(&payload);
        let mut i = TCompactInputProtocol::new(&v1[..]);
        let ident = i.read_message_begin().unwrap();
        assert_eq!(
            (ident.message_type, ident.sequence_number),
            (TMessageType::Reply, 0)
        );
        let r = FoqsEnqueueResult::read_from_in_protocol(&mut i).unwrap();
        let ids: Vec<String> = r
            .result_value
            .unwrap()
            .results
            .unwrap()
            .into_iter()
            .map(|x| x.id.unwrap())
            .collect();
        assert_eq!(ids.len(), 2);

        // 3. dequeue, zlib-transformed: the reply is zlib too, in priority order.
        let deq = call(true, "dequeue", 0, |o| {
            FoqsDequeueArgs {
                req: DequeueRequest {
                    forwarded_for: None,
                    topics: Some(vec![topic_req(ns, topic, 10)]),
                    wait_ms: None,
                    local_only: None,
                    forwarded_by: None,
                },
            }
            .write_to_out_protocol(o)
        });
        s.write_all(&fb_frame(2, &[1], &zlib(&deq))).unwrap();
        let (transforms, payload) = read_fb_reply(&mut s);
        assert_eq!(
            transforms,
            vec![1],
            "the reply carries the request's transform"
        );
        let v1 = as_v1(&payload);
        let mut i = TCompactInputProtocol::new(&v1[..]);
        i.read_message_begin().unwrap();
        let items = FoqsDequeueResult::read_from_in_protocol(&mut i)
            .unwrap()
            .result_value
            .unwrap()
            .items
            .unwrap();
        let got: Vec<_> = items.iter().map(|x| x.payload.clone().unwrap()).collect();
        assert_eq!(got, vec![b"first".to_vec(), b"later".to_vec()]);

        // 4. ack both.
        let ack = call(true, "ack", 0, |o| {
            FoqsAckArgs {
                req: AckRequest {
                    ids: Some(ids.clone()),
                    forwarded_by: None,
                    forwarded_for: None,
                    lease_ids: None,
                },
            }
            .write_to_out_protocol(o)
        });
        s.write_all(&fb_frame(2, &[], &ack)).unwrap();
        let (_, payload) = read_fb_reply(&mut s);
        let v1 = as_v1(&payload);
        let mut i = TCompactInputProtocol::new(&v1[..]);
        i.read_message_begin().unwrap();
        let results = FoqsAckResult::read_from_in_protocol(&mut i)
            .unwrap()
            .result_value
            .unwrap()
            .results
            .unwrap();
        assert!(results.iter().all(|r| r.error.is_none()), "{results:?}");

        // 5. client_timeout bounds a long poll: 2000 ms in the header, 10 s asked.
        let poll = call(true, "dequeue", 0, |o| {
            FoqsDequeueArgs {
                req: DequeueRequest {
                    forwarded_for: None,
                    topics: Some(vec![topic_req(ns, topic, 1)]),
                    wait_ms: Some(10_000),
                    local_only: None,
                    forwarded_by: None,
                },
            }
            .write_to_out_protocol(o)
        });
        let started = Instant::now();
        s.write_all(&fb_frame(2, &[], &poll)).unwrap();
        read_fb_reply(&mut s);
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(1500) && took < Duration::from_millis(2000),
            "the long poll ended within the client's timeout: {took:?}"
        );

        // 6. A client_timeout sent once as a persistent header holds for the connection's
        // later frames, which carry no headers (fbthrift sends persistent ones once).
        let persistent: [(u64, &[(&str, &str)]); 1] = [(2, &[("client_timeout", "1000")])];
        for info in [&persistent[..], &[]] {
            let started = Instant::now();
            s.write_all(&fb_frame_with(2, &[], info, &poll)).unwrap();
            read_fb_reply(&mut s);
            let took = started.elapsed();
            assert!(
                took >= Duration::from_millis(700) && took < Duration::from_millis(1000),
                "a persistent client_timeout bounds the long poll: {took:?}"
            );
        }
    });
    srv.stop().await;
}

/// One length-prefixed frame (length included).
fn read_one_frame(s: &mut TcpStream) -> Vec<u8> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    let mut f = vec![0; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut f).unwrap();
    [&len[..], &f].concat()
}

/// Bytes a server sends within `within`, until it closes or stops sending.
fn read_answer(s: &mut TcpStream, within: Duration) -> (Vec<u8>, bool) {
    s.set_read_timeout(Some(within)).unwrap();
    let mut out = Vec::new();
    let mut b = [0u8; 4096];
    loop {
        match s.read(&mut b) {
            Ok(0) => return (out, true),
            Ok(n) => out.extend_from_slice(&b[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return (out, true),
            Err(_) => return (out, false),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_of_every_transport_is_answered_or_closed_at_once() {
    let srv = server().await;
    let metrics = srv.running.as_ref().unwrap().metrics_addr.unwrap();
    let info = call(false, "getHostInfo", 3, |o| {
        FoqsGetHostInfoArgs {}.write_to_out_protocol(o)
    });
    // A bomb: 1 MiB of zeros inflates past the 64 KiB limit from a 1 KiB body.
    let mut bomb_msg = info.clone();
    bomb_msg.resize(1 << 20, 0);
    let bomb = zlib(&bomb_msg);
    assert!(bomb.len() < 2048);
    let mut too_big_header = fb_frame(0, &[], &info);
    too_big_header[12..14].copy_from_slice(&0x4000u16.to_be_bytes());
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        // Answered with an exception; the connection goes on.
        ("unknown transform (snappy)", fb_frame(0, &[3], &info), "exception:8"),
        ("unknown protocol (JSON)", fb_frame(1, &[], &info), "exception:9"),
        ("zlib past the limit", fb_frame(0, &[1], &bomb), "exception:8"),
        (
            "a header that says binary over a compact payload",
            fb_frame(0, &[], &call(true, "getHostInfo", 3, |o| FoqsGetHostInfoArgs {}.write_to_out_protocol(o))),
            "exception:9",
        ),
        // Closed.
        ("header size past the frame", too_big_header, "close"),
        ("HTTP that is not Thrift", b"POST / HTTP/1.1\r\nContent-Type: text/html\r\nContent-Length: 2\r\n\r\nhi".to_vec(), "http:415"),
        ("HTTP over the limit", format!("POST / HTTP/1.1\r\nContent-Type: application/x-thrift\r\nContent-Length: {}\r\n\r\n", MAX_FRAME + 1).into_bytes(), "http:413"),
        ("a GET", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), "http:405"),
        ("HTTP over the limit, body sent along", {
            let mut r = format!("POST / HTTP/1.1\r\nContent-Type: application/x-thrift\r\nContent-Length: {}\r\n\r\n", MAX_FRAME + 1).into_bytes();
            r.resize(r.len() + MAX_FRAME / 2, b'b');
            r
        }, "http:413"),
        ("garbage", b"\xde\xad\xbe\xef garbage".to_vec(), "close"),
        ("unframed over the limit", {
            let mut m = info[..4].to_vec();
            m.extend_from_slice(&(MAX_FRAME as u32 + 100).to_be_bytes());
            m.extend_from_slice(&vec![b'x'; MAX_FRAME + 10]);
            m
        }, "close"),
        ("unframed garbage", {
            // The message header whole, then a field of type 0x77, which no protocol has.
            let mut m = info[..23].to_vec();
            m.extend_from_slice(b"\x77\x00\x01");
            m
        }, "close"),
    ];
    // A connection in use throughout, which every case must leave alone.
    let mut bystander = Client::connect(srv.addr, Proto::Compact);
    tokio::task::block_in_place(|| {
        for (what, bytes, expect) in cases {
            let started = Instant::now();
            let mut s = raw(srv.addr);
            // The server may close before taking all of it.
            let _ = s.write_all(&bytes);
            if let Some(kind) = expect.strip_prefix("exception:") {
                let answer = read_one_frame(&mut s);
                assert!(
                    started.elapsed() < Duration::from_secs(2),
                    "{what}: answered at once"
                );
                let payload_at = 4 + 10 + 4 * u16::from_be_bytes([answer[12], answer[13]]) as usize;
                assert_eq!(
                    u32::from_be_bytes(answer[8..12].try_into().unwrap()),
                    7,
                    "{what}"
                );
                // The reply carries the request's transforms that foqs applies (zlib).
                let transforms = &answer[16..16 + answer[15] as usize];
                let payload = if transforms.contains(&1) {
                    unzlib(&answer[payload_at..])
                } else {
                    answer[payload_at..].to_vec()
                };
                let mut i = TBinaryInputProtocol::new(&payload[..], true);
                let ident = i.read_message_begin().unwrap();
                assert_eq!(
                    (ident.message_type, ident.sequence_number),
                    (TMessageType::Exception, 7)
                );
                let e = thrift::Error::read_application_error_from_in_protocol(&mut i).unwrap();
                assert_eq!(
                    e.kind as i32,
                    kind.parse::<i32>().unwrap(),
                    "{what}: {}",
                    e.message
                );
                // And it still serves a good frame.
                s.write_all(&fb_frame(0, &[], &info)).unwrap();
                assert!(
                    read_one_frame(&mut s).len() > 20,
                    "{what}: served after the exception"
                );
            } else {
                let (answer, closed) = read_answer(&mut s, Duration::from_secs(3));
                let took = started.elapsed();
                assert!(
                    closed,
                    "{what}: closed, got {:?}",
                    String::from_utf8_lossy(&answer)
                );
                assert!(
                    took < Duration::from_secs(2),
                    "{what}: closed at once, took {took:?}"
                );
                if let Some(status) = expect.strip_prefix("http:") {
                    let head = String::from_utf8_lossy(&answer);
                    assert!(
                        head.starts_with(&format!("HTTP/1.1 {status} ")),
                        "{what}: {head}"
                    );
                }
            }
            assert_eq!(bystander.host_info().shards.unwrap().len(), 2, "{what}");
        }
    });
    let (_, scrape) = tokio::task::block_in_place(|| http_get(metrics, "/metrics"));
    for reason in [
        "unknown_transport",
        "bad_header",
        "bad_http",
        "too_large",
        "bad_message",
    ] {
        let series = format!("foqs_connections_closed_total{{reason=\"{reason}\"}}");
        assert!(sample(&scrape, &series) >= 1.0, "{series} in\n{scrape}");
    }
    srv.stop().await;
}
