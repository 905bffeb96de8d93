//! THeader, the transport of fbthrift (and of Apache Thrift's `THeaderTransport`): a frame
//! whose length is followed by the magic `0x0FFF`, flags, a sequence id and a variable
//! header (protocol id, transforms, info headers), then the payload. The layout is Apache
//! Thrift's `doc/specs/HeaderFormat.md`; where the spec is silent this follows fbthrift's
//! `THeader.cpp` and `HeaderServerChannel`:
//! - the payload starts where the header size says, whatever the info headers hold
//!   (padding is skipped by the size, never by counting); an info id of 0 (padding) or
//!   one not known ends the info headers;
//! - key/value (1) and persistent key/value (2) headers are both read, as fbthrift does;
//! - a reply carries the request's sequence id, flags, protocol and transforms;
//! - an unknown transform or protocol is answered with a `TApplicationException` named
//!   `""` with the header's sequence id, and the connection keeps going (fbthrift does
//!   this for transforms; for an unknown protocol it closes, which tells the client less).

use std::io::{Read, Write};

use super::Protocol;

pub const MAGIC: [u8; 2] = [0x0f, 0xff];

/// The fixed part after the length: magic, flags, sequence id, header size.
const FIXED: usize = 10;

const PROTOCOL_BINARY: u64 = 0;
const PROTOCOL_COMPACT: u64 = 2;
const TRANSFORM_ZLIB: u64 = 1;
const INFO_PADDING: u64 = 0;
const INFO_KEYVALUE: u64 = 1;
const INFO_PKEYVALUE: u64 = 2;

/// Most info headers read from one frame; more are ignored (they are advisory).
const INFO_HEADERS_MAX: usize = 64;

/// What a reply must repeat of its request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub seq_id: u32,
    pub flags: u16,
    pub proto: Protocol,
    /// Only zlib, the one transform foqs knows.
    pub zlib: bool,
}

/// Why a header frame cannot be served; `Answer`s get an exception, the rest a close.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Answer with a `TApplicationException` of this kind (in `reply`'s protocol).
    Answer {
        reply: Reply,
        kind: thrift::ApplicationErrorKind,
        message: String,
    },
    /// The frame itself is malformed: close.
    Malformed(String),
}

/// A request taken out of a THeader frame.
#[derive(Debug)]
pub struct Request {
    pub reply: Reply,
    /// The payload (inflated when the frame was zlib-transformed).
    pub payload: Payload,
    /// `client_timeout` in milliseconds, from this frame's key/value headers.
    pub client_timeout_ms: Option<u64>,
    /// `client_timeout` from persistent headers: it holds for the connection's later
    /// frames too (fbthrift sends persistent headers once).
    pub persistent_client_timeout_ms: Option<u64>,
}

#[derive(Debug)]
pub enum Payload {
    /// A range of the frame (no transform).
    Slice(std::ops::Range<usize>),
    Owned(Vec<u8>),
}

struct Cursor<'a> {
    buf: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for i in 0..10 {
            let b = *self.buf.get(self.at).ok_or("header ends inside a varint")?;
            self.at += 1;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("varint too long".into())
    }

    fn string(&mut self) -> Result<&[u8], String> {
        let n = self.varint()? as usize;
        let end = self.at.checked_add(n).filter(|e| *e <= self.buf.len());
        let end = end.ok_or("an info header runs past the header")?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }
}

/// Reads one THeader frame (`frame` is what follows the 4-byte length, and starts with
/// [`MAGIC`]); the payload inflated is bounded by `max_bytes`.
pub fn parse(frame: &[u8], max_bytes: usize) -> Result<Request, Refusal> {
    let malformed = |m: &str| Refusal::Malformed(m.to_string());
    if frame.len() < FIXED || frame[..2] != MAGIC {
        return Err(malformed("header frame shorter than its fixed part"));
    }
    let flags = u16::from_be_bytes([frame[2], frame[3]]);
    let seq_id = u32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
    let header_end = FIXED + 4 * usize::from(u16::from_be_bytes([frame[8], frame[9]]));
    if header_end > frame.len() {
        return Err(malformed("header size is larger than the frame"));
    }
    let mut c = Cursor {
        buf: &frame[..header_end],
        at: FIXED,
    };
    let protocol = c.varint().map_err(Refusal::Malformed)?;
    let mut reply = Reply {
        seq_id,
        flags,
        proto: Protocol::Binary,
        zlib: false,
    };
    let answer = |reply: &Reply, kind, message: String| Refusal::Answer {
        reply: reply.clone(),
        kind,
        message,
    };
    let proto = match protocol {
        PROTOCOL_BINARY => Protocol::Binary,
        PROTOCOL_COMPACT => Protocol::Compact,
        other => {
            return Err(answer(
                &reply,
                thrift::ApplicationErrorKind::InvalidProtocol,
                format!("protocol id {other} is not served here: use 0 (binary) or 2 (compact)"),
            ))
        }
    };
    reply.proto = proto;
    let transforms = c.varint().map_err(Refusal::Malformed)?;
    let mut unknown = None;
    for _ in 0..transforms.min(16) {
        match c.varint().map_err(Refusal::Malformed)? {
            TRANSFORM_ZLIB => reply.zlib = true,
            other => unknown = unknown.or(Some(other)),
        }
    }
    if transforms > 16 {
        return Err(malformed("more than 16 transforms"));
    }
    if let Some(t) = unknown {
        // The reply carries no transform foqs cannot apply.
        return Err(answer(
            &reply,
            thrift::ApplicationErrorKind::InvalidTransform,
            format!("transform {t} is not supported here (only zlib, 1)"),
        ));
    }
    let (client_timeout_ms, persistent_client_timeout_ms) = info_headers(&mut c);
    let body = &frame[header_end..];
    let payload =
        if reply.zlib {
            Payload::Owned(inflate(body, max_bytes).map_err(|why| {
                answer(&reply, thrift::ApplicationErrorKind::InvalidTransform, why)
            })?)
        } else {
            Payload::Slice(header_end..frame.len())
        };
    Ok(Request {
        reply,
        payload,
        client_timeout_ms,
        persistent_client_timeout_ms,
    })
}

/// Reads the info headers and returns `client_timeout` from the key/value and from the
/// persistent key/value headers; the others (`client_id`, `thrift_priority`,
/// `client_metadata`, ...) are advisory and not kept. A malformed info header ends the
/// reading: the payload's place is known from the header size anyway.
fn info_headers(c: &mut Cursor) -> (Option<u64>, Option<u64>) {
    let (mut plain, mut persistent) = (None, None);
    let mut seen = 0;
    while c.at < c.buf.len() {
        let Ok(id) = c.varint() else { break };
        if id == INFO_PADDING || (id != INFO_KEYVALUE && id != INFO_PKEYVALUE) {
            break;
        }
        let Ok(n) = c.varint() else { break };
        for _ in 0..n {
            let (Ok(k), Ok(v)) = (c.string().map(<[u8]>::to_vec), c.string()) else {
                return (plain, persistent);
            };
            seen += 1;
            if seen > INFO_HEADERS_MAX {
                return (plain, persistent);
            }
            if k == b"client_timeout" {
                let ms = std::str::from_utf8(v).ok().and_then(|s| s.parse().ok());
                if id == INFO_PKEYVALUE {
                    persistent = ms;
                } else {
                    plain = ms;
                }
            }
        }
    }
    (plain, persistent)
}

/// Most a zlib payload may inflate, as a multiple of its own size (plus
/// [`INFLATE_SLACK_BYTES`]). Thrift messages compress a few times over; zlib can reach
/// about 1000x, and inflating is work done on the connection's task: the ratio keeps that
/// work in proportion to the bytes a client sends, like everything else it asks for.
pub const INFLATE_RATIO_MAX: usize = 64;
const INFLATE_SLACK_BYTES: usize = 64 * 1024;

/// zlib-inflates `body`, refusing (at no more cost than the limit) anything that inflates
/// past `max_bytes` or past [`INFLATE_RATIO_MAX`] times its size.
fn inflate(body: &[u8], max_bytes: usize) -> Result<Vec<u8>, String> {
    let limit = max_bytes.min(
        body.len()
            .saturating_mul(INFLATE_RATIO_MAX)
            .saturating_add(INFLATE_SLACK_BYTES),
    );
    let mut out = Vec::new();
    let mut d = flate2::read::ZlibDecoder::new(body).take(limit as u64 + 1);
    d.read_to_end(&mut out)
        .map_err(|e| format!("zlib payload does not inflate: {e}"))?;
    if out.len() > limit {
        return Err(format!(
            "zlib payload inflates past {limit} bytes (the frame limit, or {INFLATE_RATIO_MAX}x its size)"
        ));
    }
    Ok(out)
}

/// One THeader frame (length included) carrying `msg` as `reply` says; also what foqs's
/// own THeader client sends.
pub fn frame(reply: &Reply, msg: &[u8]) -> Vec<u8> {
    let (mut out, body) = frame_parts(reply, msg.to_vec());
    out.extend_from_slice(&body);
    out
}

/// [`frame`] as its head (length, fixed fields, header) and its body.
pub fn frame_parts(reply: &Reply, msg: Vec<u8>) -> (Vec<u8>, Vec<u8>) {
    let body = if reply.zlib {
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        z.write_all(&msg).expect("writing to a Vec cannot fail");
        z.finish().expect("writing to a Vec cannot fail")
    } else {
        msg
    };
    // Protocol id, then the transforms: each a one-byte varint here.
    let mut header = vec![
        match reply.proto {
            Protocol::Binary => PROTOCOL_BINARY as u8,
            Protocol::Compact => PROTOCOL_COMPACT as u8,
        },
        u8::from(reply.zlib),
    ];
    if reply.zlib {
        header.push(TRANSFORM_ZLIB as u8);
    }
    header.resize(header.len().div_ceil(4) * 4, 0);
    let len = FIXED + header.len() + body.len();
    let mut out = Vec::with_capacity(4 + FIXED + header.len());
    out.extend_from_slice(&(len as u32).to_be_bytes());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&reply.flags.to_be_bytes());
    out.extend_from_slice(&reply.seq_id.to_be_bytes());
    out.extend_from_slice(&((header.len() / 4) as u16).to_be_bytes());
    out.extend_from_slice(&header);
    (out, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(zlib: bool) -> Reply {
        Reply {
            seq_id: 7,
            flags: 1,
            proto: Protocol::Compact,
            zlib,
        }
    }

    fn payload<'a>(frame: &'a [u8], r: &'a Request) -> &'a [u8] {
        match &r.payload {
            Payload::Slice(range) => &frame[range.clone()],
            Payload::Owned(v) => v,
        }
    }

    #[test]
    fn a_frame_reads_back_with_and_without_zlib() {
        for zlib in [false, true] {
            let f = frame(&reply(zlib), b"hello, header");
            assert_eq!(
                u32::from_be_bytes(f[..4].try_into().unwrap()) as usize,
                f.len() - 4
            );
            let r = parse(&f[4..], 1 << 20).unwrap();
            assert_eq!(r.reply, reply(zlib));
            assert_eq!(payload(&f[4..], &r), b"hello, header");
        }
    }

    /// A frame with info headers: a persistent block first (fbthrift Go), then a
    /// key/value block, then padding by the header size.
    #[test]
    fn info_headers_of_both_kinds_and_padding_by_size() {
        let mut h = vec![2, 0]; // compact, no transforms
        h.extend_from_slice(&[2, 1, 9]);
        h.extend_from_slice(b"client_id");
        h.extend_from_slice(&[3]);
        h.extend_from_slice(b"abc");
        h.extend_from_slice(&[1, 1, 14]);
        h.extend_from_slice(b"client_timeout");
        h.extend_from_slice(&[3]);
        h.extend_from_slice(b"250");
        h.resize(h.len().div_ceil(4) * 4 + 8, 0); // more padding than needed
        let mut f = vec![0x0f, 0xff, 0, 1, 0, 0, 0, 7];
        f.extend_from_slice(&((h.len() / 4) as u16).to_be_bytes());
        f.extend_from_slice(&h);
        f.extend_from_slice(b"body");
        let r = parse(&f, 100).unwrap();
        assert_eq!(
            (r.client_timeout_ms, r.persistent_client_timeout_ms),
            (Some(250), None)
        );
        assert_eq!(payload(&f, &r), b"body");
        assert_eq!((r.reply.seq_id, r.reply.flags), (7, 1));
    }

    #[test]
    fn refusals() {
        let f = frame(&reply(false), b"x");
        // A header size larger than the frame.
        let mut big = f[4..].to_vec();
        big[8..10].copy_from_slice(&1000u16.to_be_bytes());
        assert!(matches!(parse(&big, 100), Err(Refusal::Malformed(_))));
        // An unknown transform (snappy, 3) and an unknown protocol (JSON, 1).
        let mut snappy = f[4..].to_vec();
        snappy[11..13].copy_from_slice(&[1, 3]);
        let Err(Refusal::Answer { kind, reply: r, .. }) = parse(&snappy, 100) else {
            panic!("an unknown transform is answered");
        };
        assert_eq!(kind, thrift::ApplicationErrorKind::InvalidTransform);
        assert_eq!(r.seq_id, 7);
        let mut json = f[4..].to_vec();
        json[10] = 1;
        assert!(matches!(
            parse(&json, 100),
            Err(Refusal::Answer {
                kind: thrift::ApplicationErrorKind::InvalidProtocol,
                ..
            })
        ));
        // A zip bomb: a megabyte of zeros deflates to about a kilobyte; refused by the
        // frame limit, and by the ratio under a large frame limit.
        let bomb = frame(&reply(true), &vec![0u8; 1 << 20]);
        assert!(bomb.len() < 8 << 10);
        for limit in [64 << 10, 16 << 20] {
            let Err(Refusal::Answer { message, .. }) = parse(&bomb[4..], limit) else {
                panic!("a zip bomb is refused");
            };
            assert!(message.contains("inflates past"), "{message}");
        }
    }
}
