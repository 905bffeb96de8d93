//! One connection's requests without the socket: the bytes read so far go to the
//! transport decoder ([`crate::wire::Decoder`]), each request it finds to
//! [`crate::rpc::handle`], and what comes back is wrapped in the request's framing. The
//! connection loop does the reading, writing and deadlines; the fuzz target and the
//! randomized test drive the same steps over a byte string.

use crate::core::{Caller, Host};
use crate::rpc::{self, Outcome};
use crate::wire::{Decoder, Envelope, Next};

/// What the connection must do with a decoded request.
#[derive(Debug)]
pub enum Step {
    /// Write `bytes`, drop the first `consumed` bytes of the buffer, and go on (or close,
    /// when `close_after`).
    Write {
        bytes: Vec<u8>,
        consumed: usize,
        close_after: bool,
        /// The request's transport and envelope (`None` for an interim write).
        envelope: Option<Envelope>,
    },
    /// Close, after writing `answer` when there is one.
    Close {
        reason: &'static str,
        detail: String,
        answer: Option<Vec<u8>>,
    },
}

/// Answers what the decoder found in `buf` (the bytes from the first request not yet
/// answered); `next` is never [`Next::Need`], which means "read more" to the caller.
pub async fn answer(next: Next, buf: &[u8], host: &Host, caller: &Caller) -> Step {
    match next {
        Next::Need => Step::Close {
            reason: "internal",
            detail: "answer() called without a request".into(),
            answer: None,
        },
        Next::Interim(bytes) => Step::Write {
            bytes: bytes.to_vec(),
            consumed: 0,
            close_after: false,
            envelope: None,
        },
        Next::Close {
            reason,
            detail,
            answer,
        } => Step::Close {
            reason,
            detail,
            answer,
        },
        Next::Exception {
            consumed,
            envelope,
            protocol,
            kind,
            message,
        } => {
            let seq_id = match &envelope {
                Envelope::Header(h) => h.seq_id as i32,
                _ => 0,
            };
            host.metrics()
                .transport_request(envelope.transport().label(), protocol.label());
            let msg = rpc::exception(protocol, seq_id, kind, message);
            Step::Write {
                bytes: envelope.wrap(&msg),
                consumed,
                close_after: !envelope.keep_open(),
                envelope: Some(envelope),
            }
        }
        Next::Request(req) => {
            let msg = req.message.bytes(buf);
            let protocol = rpc::Protocol::detect(msg).map_or("unknown", |p| p.label());
            host.metrics()
                .transport_request(req.envelope.transport().label(), protocol);
            match rpc::handle(msg, host, caller, req.client_timeout_ms).await {
                Outcome::Reply(reply) => Step::Write {
                    bytes: req.envelope.wrap(&reply),
                    consumed: req.consumed,
                    close_after: !req.envelope.keep_open(),
                    envelope: Some(req.envelope),
                },
                Outcome::Close(why) => Step::Close {
                    reason: "bad_message",
                    answer: req.envelope.refusal(&why),
                    detail: why,
                },
            }
        }
    }
}

/// Serves `bytes` as one connection's whole input (what arrived, all at once) and returns
/// what would be written, in order, and why the connection ended (`None`: it waits for
/// more). For the fuzz target and the randomized test.
#[doc(hidden)]
pub async fn replay(
    bytes: &[u8],
    max_bytes: usize,
    host: &Host,
    caller: &Caller,
) -> (Vec<(Option<Envelope>, Vec<u8>)>, Option<&'static str>) {
    let mut decoder = Decoder::new(max_bytes);
    let mut at = 0;
    let mut out = Vec::new();
    loop {
        let next = decoder.next(&bytes[at..]);
        if let Next::Need = next {
            return (out, None);
        }
        match answer(next, &bytes[at..], host, caller).await {
            Step::Write {
                bytes: w,
                consumed,
                close_after,
                envelope,
            } => {
                out.push((envelope, w));
                at += consumed;
                if close_after {
                    return (out, Some("closed_after_reply"));
                }
            }
            Step::Close { reason, answer, .. } => {
                if let Some(a) = answer {
                    out.push((None, a));
                }
                return (out, Some(reason));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::{check_reply, mangle};
    use std::sync::Arc;
    use thrift::protocol::TMessageType;

    /// Checks everything written for one input; counts (replies, exceptions).
    fn check(out: &[(Option<Envelope>, Vec<u8>)], what: &str) -> (u32, u32) {
        let (mut replies, mut exceptions) = (0, 0);
        for (envelope, bytes) in out {
            let Some(envelope) = envelope else {
                // An interim 100 Continue or an HTTP refusal.
                assert!(bytes.starts_with(b"HTTP/1.1 "), "{what}: {bytes:02x?}");
                continue;
            };
            let (protocol, msg) = mangle::reply_message(envelope, bytes)
                .unwrap_or_else(|e| panic!("{what}: badly framed reply: {e}"));
            match check_reply(protocol, &msg) {
                Ok(TMessageType::Exception) => exceptions += 1,
                Ok(_) => replies += 1,
                Err(e) => panic!("{what}: bad reply: {e}"),
            }
        }
        (replies, exceptions)
    }

    #[tokio::test]
    async fn a_hundred_thousand_mangled_inputs_in_every_transport_get_valid_replies_or_a_close() {
        let host = Host::detached(Arc::new(crate::clock::SystemClock));
        let caller = Caller::anonymous();
        let max = 1 << 20;
        let streams = mangle::streams();
        // Every seed is valid: each gets replies (two for the pipelined one), no exception,
        // and the connection waits for more.
        for (n, s) in streams.iter().enumerate() {
            let (out, end) = replay(s, max, &host, &caller).await;
            assert_eq!(end, None, "seed {n} ended the connection");
            let (replies, exceptions) = check(&out, &format!("seed {n}"));
            assert!(replies >= 1 && exceptions == 0, "seed {n}: {out:02x?}");
        }
        let seed = std::env::var("FOQS_DECODER_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x5eed_f005);
        let mut rng = mangle::Rng::new(seed);
        let (mut replies, mut exceptions, mut closes) = (0u32, 0u32, 0u32);
        let started = std::time::Instant::now();
        for n in 0..100_000 {
            let input = mangle::mangle(&mut rng, &streams);
            let (out, end) = replay(&input, max, &host, &caller).await;
            let (r, e) = check(&out, &format!("input {n} (seed {seed})"));
            replies += r;
            exceptions += e;
            closes += u32::from(end.is_some());
        }
        eprintln!(
            "100000 mangled inputs in {:?}: {replies} replies, {exceptions} exceptions, {closes} closes",
            started.elapsed()
        );
        assert!(replies > 1_000 && exceptions > 1_000 && closes > 1_000);
    }
}
