//! Thrift over HTTP/1.1, as Apache's `THttpClient` sends it: `POST` (any path) with
//! `Content-Type: application/x-thrift` and a `Content-Length` body holding one binary or
//! compact message; the reply is a 200 with the reply message as its body. Keep-alive is
//! HTTP/1.1's default (HTTP/1.0 asks for it); `Expect: 100-continue` is answered, as
//! curl waits for it before sending a larger body.
//!
//! The request head is parsed by `httparse` (hyper's parser). The connection itself stays
//! in foqs's loop, so an HTTP client gets the same limits as every other transport (frame
//! deadline, idle timeout, eviction at the cap, graceful shutdown).

/// Largest request head: Apache's clients send a few hundred bytes.
pub const HEAD_BYTES_MAX: usize = 16 * 1024;
const HEADERS_MAX: usize = 64;

/// The content types a Thrift HTTP client sends (Apache's `THttpClient`: the first).
const THRIFT_TYPES: [&str; 3] = [
    "application/x-thrift",
    "application/vnd.apache.thrift.binary",
    "application/vnd.apache.thrift.compact",
];

/// What the reply must say, from the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub keep_alive: bool,
    /// Echoed: the client sent one of [`THRIFT_TYPES`].
    pub content_type: &'static str,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Head {
    /// The head is not complete yet.
    Incomplete,
    /// A Thrift request: its head is `head_len` bytes, its body `body_len` more.
    Request {
        head_len: usize,
        body_len: usize,
        reply: Reply,
        expect_continue: bool,
    },
    /// Not a request foqs serves: answer with this status and reason, then close.
    Refuse { status: u16, reason: String },
}

/// Parses the head at the start of `buf`; `max_body` is the largest body accepted.
pub fn head(buf: &[u8], max_body: usize) -> Head {
    // An empty request target (`POST  HTTP/1.1`: Apache C++'s `THttpClient(host, port)`,
    // whose path defaults to "") is served as `/`: "any path" includes none. httparse
    // refuses it, so the head is read with the `/` put in, one byte longer.
    const EMPTY_TARGET: &[u8] = b"POST  ";
    if buf.starts_with(EMPTY_TARGET) {
        let mut fixed = b"POST / ".to_vec();
        fixed.extend_from_slice(&buf[EMPTY_TARGET.len()..]);
        return match parse_head(&fixed, max_body) {
            Head::Request {
                head_len,
                body_len,
                reply,
                expect_continue,
            } => Head::Request {
                head_len: head_len - 1,
                body_len,
                reply,
                expect_continue,
            },
            other => other,
        };
    }
    parse_head(buf, max_body)
}

fn parse_head(buf: &[u8], max_body: usize) -> Head {
    let mut headers = [httparse::EMPTY_HEADER; HEADERS_MAX];
    let mut req = httparse::Request::new(&mut headers);
    let refuse = |status, reason: &str| Head::Refuse {
        status,
        reason: reason.to_string(),
    };
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() > HEAD_BYTES_MAX => return too_large_head(),
        Ok(httparse::Status::Partial) => return Head::Incomplete,
        Err(httparse::Error::TooManyHeaders) => return refuse(431, "too many headers"),
        Err(e) => return refuse(400, &format!("not an HTTP request: {e}")),
    };
    if req.method != Some("POST") {
        return refuse(405, "only POST carries Thrift");
    }
    let version_11 = req.version == Some(1);
    let (mut length, mut content_type, mut connection, mut expect) = (None, None, None, None);
    for h in req.headers.iter() {
        let value = std::str::from_utf8(h.value).unwrap_or("").trim();
        if h.name.eq_ignore_ascii_case("content-length") {
            if length.is_some() {
                return refuse(400, "more than one Content-Length");
            }
            let Ok(n) = value.parse::<usize>() else {
                return refuse(400, "Content-Length is not a number");
            };
            length = Some(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return refuse(411, "send the body with a Content-Length, not chunked");
        } else if h.name.eq_ignore_ascii_case("content-type") {
            content_type = Some(value.to_ascii_lowercase());
        } else if h.name.eq_ignore_ascii_case("connection") {
            connection = Some(value.to_ascii_lowercase());
        } else if h.name.eq_ignore_ascii_case("expect") {
            expect = Some(value.to_ascii_lowercase());
        }
    }
    // `application/x-thrift; charset=...` is still Thrift.
    let essence = content_type
        .as_deref()
        .map(|t| t.split(';').next().unwrap_or("").trim().to_string());
    let Some(content_type) = essence.and_then(|t| THRIFT_TYPES.into_iter().find(|k| *k == t))
    else {
        return refuse(
            415,
            "this port serves Thrift: Content-Type must be application/x-thrift",
        );
    };
    let Some(body_len) = length else {
        return refuse(411, "a Content-Length is required");
    };
    if body_len > max_body {
        return refuse(413, &format!("body over the {max_body}-byte limit"));
    }
    let keep_alive = match connection.as_deref() {
        Some(c) if c.split(',').any(|t| t.trim() == "close") => false,
        Some(c) if c.split(',').any(|t| t.trim() == "keep-alive") => true,
        _ => version_11,
    };
    Head::Request {
        head_len,
        body_len,
        reply: Reply {
            keep_alive,
            content_type,
        },
        expect_continue: expect.as_deref() == Some("100-continue"),
    }
}

/// A head longer than [`HEAD_BYTES_MAX`].
pub fn too_large_head() -> Head {
    Head::Refuse {
        status: 431,
        reason: "request head too large".into(),
    }
}

pub const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// A 200 carrying `body`.
pub fn ok(reply: &Reply, body: &[u8]) -> Vec<u8> {
    let mut out = ok_head(reply, body.len());
    out.extend_from_slice(body);
    out
}

/// The status line and headers of a 200 whose body is `len` bytes.
pub fn ok_head(reply: &Reply, len: usize) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: {}\r\nContent-Length: {}\r\n{}\r\n",
        reply.content_type,
        len,
        if reply.keep_alive {
            "Connection: keep-alive\r\n"
        } else {
            "Connection: close\r\n"
        }
    )
    .into_bytes()
}

/// An error status with a plain-text reason; the connection closes after it.
pub fn error(status: u16, reason: &str) -> Vec<u8> {
    let phrase = match status {
        400 => "Bad Request",
        405 => "Method Not Allowed",
        411 => "Length Required",
        413 => "Payload Too Large",
        415 => "Unsupported Media Type",
        431 => "Request Header Fields Too Large",
        _ => "Error",
    };
    let body = format!("{reason}\n");
    let allow = if status == 405 { "Allow: POST\r\n" } else { "" };
    format!(
        "HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thrift_post_and_what_is_refused() {
        let req = b"POST /foqs HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-thrift\r\nContent-Length: 5\r\n\r\nhello";
        for end in 0..req.len() - 5 {
            assert_eq!(head(&req[..end], 100), Head::Incomplete, "prefix {end}");
        }
        let Head::Request {
            head_len,
            body_len,
            reply,
            expect_continue,
        } = head(req, 100)
        else {
            panic!("a Thrift POST is a request");
        };
        assert_eq!(
            (head_len + body_len, reply.keep_alive, expect_continue),
            (req.len(), true, false)
        );
        let status = |r: &[u8]| match head(r, 4) {
            Head::Refuse { status, .. } => status,
            other => panic!("{other:?}"),
        };
        assert_eq!(status(req), 413);
        assert_eq!(
            status(b"POST / HTTP/1.1\r\nContent-Type: text/html\r\nContent-Length: 1\r\n\r\n"),
            415
        );
        assert_eq!(
            status(b"POST / HTTP/1.1\r\nContent-Type: application/x-thrift\r\n\r\n"),
            411
        );
        assert_eq!(status(b"POST / HTTP/1.1\r\nContent-Type: application/x-thrift\r\nTransfer-Encoding: chunked\r\n\r\n"), 411);
        assert_eq!(status(b"PUT / HTTP/1.1\r\n\r\n"), 405);
        assert_eq!(status(b"POST \x01 HTTP/1.1\r\n\r\n"), 400);
        // An empty request target is `/` (Apache C++'s THttpClient sends one).
        let empty = b"POST  HTTP/1.1\r\nContent-Type: application/x-thrift\r\nContent-Length: 5\r\n\r\nhello";
        let Head::Request {
            head_len, body_len, ..
        } = head(empty, 100)
        else {
            panic!("an empty target is served: {:?}", head(empty, 100));
        };
        assert_eq!((head_len, body_len), (empty.len() - 5, 5));
        assert_eq!(head(&empty[..10], 100), Head::Incomplete);
        let ten =
            b"POST / HTTP/1.0\r\nContent-Type: application/x-thrift\r\nContent-Length: 0\r\n\r\n";
        assert!(matches!(
            head(ten, 4),
            Head::Request {
                reply: Reply {
                    keep_alive: false,
                    ..
                },
                ..
            }
        ));
    }
}
