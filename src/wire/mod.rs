//! The transports: where each Thrift message starts and ends in a connection's bytes, and
//! how its reply goes back. Sans I/O (bytes in, decisions out), so the server's loop, the
//! Rust client, the fuzz target and the tests share one decoder.
//!
//! A connection's transport is detected from its first bytes, as fbthrift's server does
//! (a frame length is at most 0x3FFFFFFF, so its first byte is at most 0x3F):
//!
//! | first bytes                          | transport                                |
//! |--------------------------------------|------------------------------------------|
//! | `80 01`                              | unframed binary (strict writer)          |
//! | `82`, then a version of 1 or 2       | unframed compact                         |
//! | a length, then `80 01`, `82` or `00` | framed (binary, compact, non-strict)     |
//! | a length, then `0F FF`               | THeader ([`header`])                     |
//! | a name length, then a letter         | unframed binary (non-strict writer)      |
//! | `POST `                              | HTTP ([`http`])                          |
//! | another HTTP method                  | HTTP, answered 405 and closed            |
//!
//! Anything else closes the connection. Framed and THeader frames may alternate on one
//! connection (both start with a length); the other transports keep to what they began
//! with. `max_bytes` bounds every kind: a frame, an unframed message, an HTTP body, an
//! inflated THeader payload.

pub mod header;
pub mod http;
pub mod scan;

use scan::{Scan, Scanner};

/// The protocol of a message: binary (strict `80 01`, or non-strict) or compact (`82`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Binary,
    Compact,
}

impl Protocol {
    /// From a message's first byte: `80` strict binary, `00` non-strict binary (a name
    /// length below 2^24), `82` compact.
    pub fn detect(msg: &[u8]) -> Option<Protocol> {
        match msg.first() {
            Some(0x80) | Some(0x00) => Some(Protocol::Binary),
            Some(0x82) => Some(Protocol::Compact),
            _ => None,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Protocol::Binary => "binary",
            Protocol::Compact => "compact",
        }
    }
}

/// A transport, for the metrics' `transport` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Framed,
    Unframed,
    Header,
    Http,
}

impl Transport {
    pub fn label(self) -> &'static str {
        match self {
            Transport::Framed => "framed",
            Transport::Unframed => "unframed",
            Transport::Header => "header",
            Transport::Http => "http",
        }
    }
}

/// How a reply goes back: the request's framing, and what the framing must repeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Envelope {
    Framed,
    Unframed,
    Header(header::Reply),
    Http(http::Reply),
}

/// A reply on the wire: `head`, then `body`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wrapped {
    pub head: Vec<u8>,
    pub body: Vec<u8>,
}

impl Wrapped {
    /// Bytes to write as they are (an interim answer).
    pub fn raw(bytes: Vec<u8>) -> Wrapped {
        Wrapped {
            head: Vec::new(),
            body: bytes,
        }
    }

    /// Both parts in one buffer.
    pub fn into_vec(self) -> Vec<u8> {
        if self.head.is_empty() {
            return self.body;
        }
        let mut out = self.head;
        out.extend_from_slice(&self.body);
        out
    }
}

impl Envelope {
    pub fn transport(&self) -> Transport {
        match self {
            Envelope::Framed => Transport::Framed,
            Envelope::Unframed => Transport::Unframed,
            Envelope::Header(_) => Transport::Header,
            Envelope::Http(_) => Transport::Http,
        }
    }

    /// The bytes that carry reply message `msg`, in one buffer.
    pub fn wrap(&self, msg: &[u8]) -> Vec<u8> {
        self.wrap_owned(msg.to_vec()).into_vec()
    }

    /// The framing of reply message `msg`, and the message (deflated when the request
    /// asked for zlib): no copy of a large reply behind its few bytes of framing.
    pub fn wrap_owned(&self, msg: Vec<u8>) -> Wrapped {
        let (head, body) = match self {
            Envelope::Framed => ((msg.len() as u32).to_be_bytes().to_vec(), msg),
            Envelope::Unframed => (Vec::new(), msg),
            Envelope::Header(h) => header::frame_parts(h, msg),
            Envelope::Http(h) => (http::ok_head(h, msg.len()), msg),
        };
        Wrapped { head, body }
    }

    /// False when the connection must close after this reply (HTTP `Connection: close`).
    pub fn keep_open(&self) -> bool {
        match self {
            Envelope::Http(h) => h.keep_alive,
            _ => true,
        }
    }

    /// What to send before closing over a message that cannot be answered: an HTTP client
    /// is told why; the others just see the close, as before.
    pub fn refusal(&self, why: &str) -> Option<Vec<u8>> {
        match self {
            Envelope::Http(_) => Some(http::error(400, why)),
            _ => None,
        }
    }
}

/// Where a request's message is.
#[derive(Debug)]
pub enum Message {
    /// A range of the bytes given to [`Decoder::next`].
    Slice(std::ops::Range<usize>),
    /// Inflated from a zlib-transformed THeader frame.
    Owned(Vec<u8>),
}

impl Message {
    pub fn bytes<'a>(&'a self, buf: &'a [u8]) -> &'a [u8] {
        match self {
            Message::Slice(r) => &buf[r.clone()],
            Message::Owned(v) => v,
        }
    }
}

#[derive(Debug)]
pub struct Request {
    /// Bytes of the buffer this request took (the next one starts after them).
    pub consumed: usize,
    pub message: Message,
    pub envelope: Envelope,
    /// THeader's `client_timeout` (ms): a long poll must answer within it.
    pub client_timeout_ms: Option<u64>,
}

/// What to do next with a connection's bytes.
#[derive(Debug)]
pub enum Next {
    /// The bytes end inside a request: read more.
    Need,
    Request(Request),
    /// Write these bytes, then read on (HTTP's `100 Continue`).
    Interim(&'static [u8]),
    /// Answer this request with a `TApplicationException` (a THeader frame with an unknown
    /// transform or protocol); the connection goes on.
    Exception {
        consumed: usize,
        envelope: Envelope,
        protocol: Protocol,
        kind: thrift::ApplicationErrorKind,
        message: String,
    },
    /// Close the connection, after writing `answer` when there is one. `reason` is the
    /// metrics label.
    Close {
        reason: &'static str,
        detail: String,
        answer: Option<Vec<u8>>,
    },
}

/// The largest frame length there is: a length's first byte is at most 0x3F, which is
/// what tells a length from the other transports' first bytes.
pub const FRAME_BYTES_MAX: usize = 0x3FFF_FFFF;

/// Longest method name taken for a non-strict binary writer's (foqs's longest is 15).
const NON_STRICT_NAME_MAX: u32 = 255;

#[derive(Debug)]
enum Mode {
    Detect,
    /// Length-prefixed: framed or THeader, per frame; `client_timeout` from the
    /// connection's persistent THeader headers, when one came.
    Framed {
        persistent_timeout_ms: Option<u64>,
    },
    Unframed(Scanner),
    Http(HttpState),
}

/// The HTTP request being read: its head is parsed once, when its end has arrived.
#[derive(Debug, Default)]
struct HttpState {
    /// Bytes already searched for the end of the head.
    searched: usize,
    head: Option<http::Head>,
    /// `100 Continue` was sent for this request.
    continued: bool,
}

impl HttpState {
    fn next(&mut self, buf: &[u8], max_bytes: usize) -> Next {
        if self.head.is_none() {
            // Only the bytes that arrived since the last look are searched.
            let from = self.searched.saturating_sub(3);
            match buf[from..].windows(4).position(|w| w == b"\r\n\r\n") {
                Some(at) => {
                    let head_len = from + at + 4;
                    self.head = Some(if head_len > http::HEAD_BYTES_MAX {
                        http::too_large_head()
                    } else {
                        http::head(&buf[..head_len], max_bytes)
                    });
                }
                None if buf.len() > http::HEAD_BYTES_MAX => {
                    self.head = Some(http::too_large_head())
                }
                None => {
                    self.searched = buf.len();
                    return Next::Need;
                }
            }
        }
        match self.head.as_ref().expect("parsed above") {
            http::Head::Incomplete => close("bad_http", "an HTTP head that does not parse whole"),
            http::Head::Refuse { status, reason } => Next::Close {
                reason: if *status == 413 {
                    "too_large"
                } else {
                    "bad_http"
                },
                answer: Some(http::error(*status, reason)),
                detail: format!("HTTP {status}: {reason}"),
            },
            http::Head::Request {
                head_len,
                body_len,
                reply,
                expect_continue,
            } => {
                let end = head_len + body_len;
                if buf.len() < end {
                    if *expect_continue && !self.continued {
                        self.continued = true;
                        return Next::Interim(http::CONTINUE);
                    }
                    return Next::Need;
                }
                let request = Request {
                    consumed: end,
                    message: Message::Slice(*head_len..end),
                    envelope: Envelope::Http(reply.clone()),
                    client_timeout_ms: None,
                };
                *self = HttpState::default();
                Next::Request(request)
            }
        }
    }
}

/// One connection's decoder: feed it the bytes read so far (from the first byte of the
/// request not yet taken) and it says what they hold.
#[derive(Debug)]
pub struct Decoder {
    max_bytes: usize,
    mode: Mode,
}

fn close(reason: &'static str, detail: impl Into<String>) -> Next {
    Next::Close {
        reason,
        detail: detail.into(),
        answer: None,
    }
}

impl Decoder {
    pub fn new(max_bytes: usize) -> Decoder {
        Decoder {
            max_bytes,
            mode: Mode::Detect,
        }
    }

    /// Largest request (with its framing) this decoder may need in its buffer.
    pub fn buffer_max(&self) -> usize {
        self.max_bytes + http::HEAD_BYTES_MAX + 4
    }

    pub fn next(&mut self, buf: &[u8]) -> Next {
        if let Mode::Detect = self.mode {
            match detect(buf, self.max_bytes) {
                None => return Next::Need,
                Some(Ok(mode)) => self.mode = mode,
                Some(Err((reason, detail))) => return close(reason, detail),
            }
        }
        match &mut self.mode {
            Mode::Detect => unreachable!("detected above"),
            Mode::Framed {
                persistent_timeout_ms,
            } => framed(buf, self.max_bytes, persistent_timeout_ms),
            Mode::Unframed(scanner) => match scanner.scan(buf) {
                Scan::Complete(n) => {
                    scanner.reset();
                    Next::Request(Request {
                        consumed: n,
                        message: Message::Slice(0..n),
                        envelope: Envelope::Unframed,
                        client_timeout_ms: None,
                    })
                }
                Scan::TooLarge => close(
                    "too_large",
                    format!("unframed message over {} bytes", self.max_bytes),
                ),
                Scan::Incomplete => Next::Need,
                Scan::Invalid(why) => close("bad_message", why),
            },
            Mode::Http(state) => state.next(buf, self.max_bytes),
        }
    }
}

/// The transport a connection's first bytes announce; `None` until enough have arrived.
/// A refusal carries its metrics label.
fn detect(buf: &[u8], max_bytes: usize) -> Option<Result<Mode, (&'static str, String)>> {
    let first = *buf.first()?;
    let refuse = |what: &str| {
        let start = &buf[..buf.len().min(8)];
        Some(Err((
            "unknown_transport",
            format!("{what}: starts {start:02x?}"),
        )))
    };
    match first {
        0x80 | 0x82 => {
            let second = *buf.get(1)?;
            if first == 0x80 && second == 0x01 {
                Some(Ok(Mode::Unframed(Scanner::new(
                    Protocol::Binary,
                    max_bytes,
                ))))
            } else if first == 0x82 && (1..=2).contains(&(second & 0x1f)) {
                Some(Ok(Mode::Unframed(Scanner::new(
                    Protocol::Compact,
                    max_bytes,
                ))))
            } else {
                refuse("neither binary version 1 nor compact version 1 or 2")
            }
        }
        0x00..=0x3f => {
            // A frame length (or a non-strict writer's name length) that no request may
            // have is refused at once, without waiting for what follows it.
            let n = u32::from_be_bytes(buf.get(..4)?.try_into().expect("four bytes"));
            if n == 0 {
                return Some(Err(("bad_frame", "frame length 0".into())));
            }
            if n as usize > max_bytes {
                let why = format!("frame of {n} bytes over the {max_bytes}-byte limit");
                return Some(Err(("too_large", why)));
            }
            match *buf.get(4)? {
                0x80 | 0x82 | 0x00 | 0x0f => Some(Ok(Mode::Framed {
                    persistent_timeout_ms: None,
                })),
                // A non-strict binary writer's method name: its (short) length, then a
                // letter. (A frame whose message starts with a letter reads the same way;
                // it is not Thrift either, and its connection waits out the frame
                // deadline instead of closing at once.)
                b'A'..=b'Z' | b'a'..=b'z' | b'_' if n <= NON_STRICT_NAME_MAX => Some(Ok(
                    Mode::Unframed(Scanner::new(Protocol::Binary, max_bytes)),
                )),
                _ => refuse("a length followed by neither a message nor a THeader"),
            }
        }
        // HTTP: only POST carries Thrift, but another method is told so (405) before
        // the close, as a curl or browser user deserves.
        b'C' | b'D' | b'G' | b'H' | b'O' | b'P' | b'T' => {
            let five = buf.get(..5)?;
            const METHODS: [&[u8]; 9] = [
                b"POST ", b"GET /", b"HEAD ", b"PUT /", b"DELET", b"OPTIO", b"PATCH", b"CONNE",
                b"TRACE",
            ];
            if METHODS.contains(&five) {
                Some(Ok(Mode::Http(HttpState::default())))
            } else {
                refuse("not a Thrift transport")
            }
        }
        _ => refuse("not a Thrift transport"),
    }
}

/// One length-prefixed frame: framed, or THeader when it starts with the magic.
fn framed(buf: &[u8], max_bytes: usize, persistent_timeout_ms: &mut Option<u64>) -> Next {
    let Some(len) = buf.get(..4) else {
        return Next::Need;
    };
    let n = i32::from_be_bytes([len[0], len[1], len[2], len[3]]);
    if n <= 0 {
        return close("bad_frame", format!("frame length {n}"));
    }
    let n = n as usize;
    if n > max_bytes {
        return close(
            "too_large",
            format!("frame of {n} bytes over the {max_bytes}-byte limit"),
        );
    }
    let Some(frame) = buf.get(4..4 + n) else {
        return Next::Need;
    };
    let consumed = 4 + n;
    if !frame.starts_with(&header::MAGIC) {
        return Next::Request(Request {
            consumed,
            message: Message::Slice(4..consumed),
            envelope: Envelope::Framed,
            client_timeout_ms: None,
        });
    }
    match header::parse(frame, max_bytes) {
        Ok(r) => {
            if r.persistent_client_timeout_ms.is_some() {
                *persistent_timeout_ms = r.persistent_client_timeout_ms;
            }
            Next::Request(Request {
                consumed,
                message: match r.payload {
                    header::Payload::Slice(s) => Message::Slice(4 + s.start..4 + s.end),
                    header::Payload::Owned(v) => Message::Owned(v),
                },
                envelope: Envelope::Header(r.reply),
                // A frame's own header wins over the persistent one, as in fbthrift.
                client_timeout_ms: r.client_timeout_ms.or(*persistent_timeout_ms),
            })
        }
        Err(header::Refusal::Answer {
            reply,
            kind,
            message,
        }) => Next::Exception {
            consumed,
            protocol: reply.proto,
            envelope: Envelope::Header(reply),
            kind,
            message,
        },
        Err(header::Refusal::Malformed(why)) => close("bad_header", why),
    }
}

#[cfg(test)]
mod tests;
