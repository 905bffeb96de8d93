//! One connection's requests without the socket: the bytes read so far go to the
//! transport decoder ([`crate::wire::Decoder`]), each request it finds to
//! [`crate::rpc::handle`], and what comes back is wrapped in the request's framing. The
//! connection loop does the reading, writing and deadlines; the fuzz target and the
//! randomized test drive the same steps over a byte string.

use crate::core::{Caller, Host};
use crate::rpc::{self, Outcome};
use crate::wire::{Decoder, Envelope, Next, Wrapped};

/// What the connection must do with a decoded request.
#[derive(Debug)]
pub enum Step {
    /// Write `bytes`, drop the first `consumed` bytes of the buffer, and go on (or close,
    /// when `close_after`).
    Write {
        bytes: Wrapped,
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
            bytes: Wrapped::raw(bytes.to_vec()),
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
        } => exception(consumed, envelope, protocol, kind, message, host),
        Next::Request(req) => {
            let msg = req.message.bytes(buf);
            let detected = rpc::Protocol::detect(msg);
            if let Envelope::Header(h) = &req.envelope {
                // The header says how to read the payload; a payload in another protocol
                // is refused as fbthrift refuses it (its reply could not be read either).
                if detected != Some(h.proto) {
                    let message = format!(
                        "the THeader says {} but the payload is not",
                        h.proto.label()
                    );
                    let kind = thrift::ApplicationErrorKind::InvalidProtocol;
                    let protocol = h.proto;
                    return exception(req.consumed, req.envelope, protocol, kind, message, host);
                }
            }
            let protocol = detected.map_or("unknown", |p| p.label());
            host.metrics()
                .transport_request(req.envelope.transport().label(), protocol);
            match rpc::handle(msg, host, caller, req.client_timeout_ms).await {
                Outcome::Reply(reply) => Step::Write {
                    bytes: req.envelope.wrap_owned(reply),
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

/// A `TApplicationException` for a request that could not be read, in its framing.
fn exception(
    consumed: usize,
    envelope: Envelope,
    protocol: rpc::Protocol,
    kind: thrift::ApplicationErrorKind,
    message: String,
    host: &Host,
) -> Step {
    let seq_id = match &envelope {
        Envelope::Header(h) => h.seq_id as i32,
        _ => 0,
    };
    host.metrics()
        .transport_request(envelope.transport().label(), protocol.label());
    let msg = rpc::exception(protocol, seq_id, kind, message);
    Step::Write {
        bytes: envelope.wrap_owned(msg),
        consumed,
        close_after: !envelope.keep_open(),
        envelope: Some(envelope),
    }
}

/// What one connection wrote, in order, and why it ended (`None`: it waits for more).
pub type Replayed = (Vec<(Option<Envelope>, Vec<u8>)>, Option<&'static str>);

/// Serves `bytes` as one connection's whole input, arriving in pieces that end at each of
/// `splits` (ascending; then the rest), and returns what would be written. For the fuzz
/// target and the randomized test: however the input is split, what is written must be
/// the same.
#[doc(hidden)]
pub async fn replay(
    bytes: &[u8],
    splits: &[usize],
    max_bytes: usize,
    host: &Host,
    caller: &Caller,
) -> Replayed {
    let mut decoder = Decoder::new(max_bytes);
    let mut ends = splits
        .iter()
        .copied()
        .filter(|e| *e < bytes.len())
        .chain(std::iter::once(bytes.len()));
    let mut arrived = ends.next().unwrap_or(bytes.len());
    let mut at = 0;
    let mut out = Vec::new();
    loop {
        let next = decoder.next(&bytes[at..arrived.max(at)]);
        if let Next::Need = next {
            match ends.next() {
                Some(e) => {
                    arrived = arrived.max(e);
                    continue;
                }
                None => return (out, None),
            }
        }
        match answer(next, &bytes[at..arrived.max(at)], host, caller).await {
            Step::Write {
                bytes: w,
                consumed,
                close_after,
                envelope,
            } => {
                out.push((envelope, w.into_vec()));
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
    use crate::wire::Protocol;
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

    type Shape = (
        Vec<(Option<Envelope>, Option<TMessageType>)>,
        Option<&'static str>,
    );

    /// What must not depend on how the input was split: the framing of each write, the
    /// kind of each message, and how the connection ended.
    fn shape(r: &Replayed) -> Shape {
        let kinds =
            r.0.iter()
                .map(|(e, b)| {
                    let kind = e.as_ref().map(|e| {
                        let (p, m) = mangle::reply_message(e, b).expect("framed as its request");
                        check_reply(p, &m).expect("well-formed")
                    });
                    (e.clone(), kind)
                })
                .collect();
        (kinds, r.1)
    }

    #[tokio::test]
    async fn a_hundred_thousand_mangled_inputs_in_every_transport_get_valid_replies_or_a_close() {
        let host = Host::detached(Arc::new(crate::clock::SystemClock));
        let caller = Caller::anonymous();
        let max = 1 << 20;
        let streams = mangle::streams();
        // Every seed is valid: each gets replies (two for the pipelined one), no exception,
        // and the connection waits for more. Compact replies are in the request's version:
        // 2 inside THeader (the seeds are fbthrift's there), 1 elsewhere.
        for (n, s) in streams.iter().enumerate() {
            let (out, end) = replay(s, &[], max, &host, &caller).await;
            assert_eq!(end, None, "seed {n} ended the connection");
            let (replies, exceptions) = check(&out, &format!("seed {n}"));
            assert!(replies >= 1 && exceptions == 0, "seed {n}: {out:02x?}");
            for (envelope, bytes) in &out {
                let envelope = envelope.as_ref().expect("a reply");
                let (protocol, msg) = mangle::reply_message(envelope, bytes).unwrap();
                if protocol == Protocol::Compact {
                    let want = if matches!(envelope, Envelope::Header(_)) {
                        2
                    } else {
                        1
                    };
                    assert_eq!(msg[1] & 0x1f, want, "seed {n}: compact version");
                }
            }
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
            let whole = replay(&input, &[], max, &host, &caller).await;
            let (r, e) = check(&whole.0, &format!("input {n} (seed {seed})"));
            replies += r;
            exceptions += e;
            closes += u32::from(whole.1.is_some());
            // One in ten again in random pieces (as the socket may deliver it): the same
            // writes, the same end.
            if n % 10 == 0 && !input.is_empty() {
                let mut splits: Vec<usize> = (0..1 + rng.below(4))
                    .map(|_| rng.below(input.len()))
                    .collect();
                splits.sort_unstable();
                let pieces = replay(&input, &splits, max, &host, &caller).await;
                assert_eq!(
                    shape(&pieces),
                    shape(&whole),
                    "input {n} (seed {seed}) split at {splits:?}"
                );
            }
        }
        eprintln!(
            "100000 mangled inputs in {:?}: {replies} replies, {exceptions} exceptions, {closes} closes",
            started.elapsed()
        );
        assert!(replies > 1_000 && exceptions > 1_000 && closes > 1_000);
    }

    #[tokio::test]
    async fn every_seed_arriving_a_byte_at_a_time_is_answered_the_same() {
        let host = Host::detached(Arc::new(crate::clock::SystemClock));
        let caller = Caller::anonymous();
        for (n, s) in mangle::streams().iter().enumerate() {
            let whole = replay(s, &[], 1 << 20, &host, &caller).await;
            let bytewise: Vec<usize> = (1..s.len()).collect();
            let pieces = replay(s, &bytewise, 1 << 20, &host, &caller).await;
            assert_eq!(shape(&pieces), shape(&whole), "seed {n}");
        }
    }
}
