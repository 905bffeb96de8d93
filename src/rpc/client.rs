//! A blocking Thrift client for foqsd (the generated client over binary or compact
//! protocol, framed, unframed or THeader, on a TCP or TLS socket), for tools, benchmarks
//! and tests written in Rust. The Thrift crate has no THeader transport; the one here
//! writes and reads frames with [`crate::wire::header`], the server's own codec.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use thrift::protocol::{
    TBinaryInputProtocol, TBinaryOutputProtocol, TCompactInputProtocol, TCompactOutputProtocol,
    TInputProtocol, TOutputProtocol,
};
use thrift::transport::{
    TBufferedReadTransport, TBufferedWriteTransport, TFramedReadTransport, TFramedWriteTransport,
    TIoChannel, TTcpChannel,
};

pub use crate::rpc::Protocol;
use crate::thrift_gen::FoqsSyncClient;
use crate::wire::header;

/// How the client frames its messages (foqsd detects each per connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientTransport {
    /// A 4-byte length before each message (what peers speak to each other).
    Framed,
    /// Messages back to back, as most Thrift libraries' default (buffered) transport.
    Unframed,
    /// THeader frames, as fbthrift clients send them; `zlib` compresses each message.
    Header { zlib: bool },
}

impl ClientTransport {
    /// From a `--transport` value: `framed`, `unframed` or `header`.
    pub fn parse(s: &str) -> Option<ClientTransport> {
        match s {
            "framed" => Some(ClientTransport::Framed),
            "unframed" => Some(ClientTransport::Unframed),
            "header" => Some(ClientTransport::Header { zlib: false }),
            _ => None,
        }
    }
}

/// Largest THeader reply payload the client accepts (foqsd's own default frame limit).
const HEADER_REPLY_BYTES_MAX: usize = 16 * 1024 * 1024;

pub type InputProtocol = Box<dyn TInputProtocol + Send>;
pub type OutputProtocol = Box<dyn TOutputProtocol + Send>;
/// Use it through the generated `TFoqsSyncClient` trait.
pub type SyncClient = FoqsSyncClient<InputProtocol, OutputProtocol>;

/// Connects to foqsd at `addr` over the framed transport; every call then waits at most
/// `timeout` for its reply.
pub fn connect(
    addr: impl ToSocketAddrs,
    protocol: Protocol,
    timeout: Duration,
) -> thrift::Result<SyncClient> {
    connect_via(addr, protocol, ClientTransport::Framed, timeout)
}

/// Connects to foqsd at `addr` over `transport`.
pub fn connect_via(
    addr: impl ToSocketAddrs,
    protocol: Protocol,
    transport: ClientTransport,
    timeout: Duration,
) -> thrift::Result<SyncClient> {
    let stream = tcp(addr, timeout)?;
    let (r, w) = TTcpChannel::with_stream(stream).split()?;
    Ok(over(r, w, protocol, transport))
}

/// Connects to foqsd at `addr` (HOST:PORT) over TLS: the server's certificate must match
/// HOST and chain to the configuration's CA; the client presents its certificate when the
/// configuration has one (see [`crate::tls::client_config`]).
pub fn connect_tls(
    addr: &str,
    protocol: Protocol,
    timeout: Duration,
    tls: std::sync::Arc<rustls::ClientConfig>,
) -> thrift::Result<SyncClient> {
    connect_tls_via(addr, protocol, ClientTransport::Framed, timeout, tls)
}

/// [`connect_tls`] over `transport`.
pub fn connect_tls_via(
    addr: &str,
    protocol: Protocol,
    transport: ClientTransport,
    timeout: Duration,
    tls: std::sync::Arc<rustls::ClientConfig>,
) -> thrift::Result<SyncClient> {
    let stream = tcp(addr, timeout)?;
    let tls = crate::tls::SyncTlsStream::connect(stream, addr, tls)
        .map_err(|e| thrift::Error::from(std::io::Error::other(e.to_string())))?;
    Ok(over(tls.clone(), tls, protocol, transport))
}

fn over<R, W>(r: R, w: W, protocol: Protocol, transport: ClientTransport) -> SyncClient
where
    R: Read + Send + 'static,
    W: Write + Send + 'static,
{
    match transport {
        ClientTransport::Framed => client(
            TFramedReadTransport::new(r),
            TFramedWriteTransport::new(w),
            protocol,
        ),
        ClientTransport::Unframed => client(
            TBufferedReadTransport::new(r),
            TBufferedWriteTransport::new(w),
            protocol,
        ),
        ClientTransport::Header { zlib } => client(
            HeaderReader {
                inner: r,
                payload: Vec::new(),
                at: 0,
            },
            HeaderWriter {
                inner: w,
                msg: Vec::new(),
                seq_id: 0,
                protocol,
                zlib,
            },
            protocol,
        ),
    }
}

/// Sends each message (written, then flushed by the generated client) as one THeader
/// frame with the next header sequence id.
struct HeaderWriter<W> {
    inner: W,
    msg: Vec<u8>,
    seq_id: u32,
    protocol: Protocol,
    zlib: bool,
}

impl<W: Write> Write for HeaderWriter<W> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.msg.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.seq_id = self.seq_id.wrapping_add(1);
        let reply = header::Reply {
            seq_id: self.seq_id,
            flags: 0,
            proto: self.protocol,
            zlib: self.zlib,
        };
        let frame = header::frame(&reply, &self.msg);
        self.msg.clear();
        self.inner.write_all(&frame)?;
        self.inner.flush()
    }
}

/// Reads THeader frames and hands out their (inflated) payloads.
struct HeaderReader<R> {
    inner: R,
    payload: Vec<u8>,
    at: usize,
}

impl<R: Read> Read for HeaderReader<R> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.at == self.payload.len() {
            let mut len = [0u8; 4];
            self.inner.read_exact(&mut len)?;
            let n = u32::from_be_bytes(len) as usize;
            if n > HEADER_REPLY_BYTES_MAX {
                return Err(std::io::Error::other(format!("THeader reply of {n} bytes")));
            }
            let mut frame = vec![0; n];
            self.inner.read_exact(&mut frame)?;
            let r = header::parse(&frame, HEADER_REPLY_BYTES_MAX)
                .map_err(|e| std::io::Error::other(format!("bad THeader reply: {e:?}")))?;
            self.payload = match r.payload {
                header::Payload::Slice(s) => frame[s].to_vec(),
                header::Payload::Owned(v) => v,
            };
            self.at = 0;
        }
        let n = out.len().min(self.payload.len() - self.at);
        out[..n].copy_from_slice(&self.payload[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

fn tcp(addr: impl ToSocketAddrs, timeout: Duration) -> thrift::Result<TcpStream> {
    let stream = TcpStream::connect(addr)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    Ok(stream)
}

fn client<R, W>(r: R, w: W, protocol: Protocol) -> SyncClient
where
    R: Read + Send + 'static,
    W: Write + Send + 'static,
{
    let (i, o): (InputProtocol, OutputProtocol) = match protocol {
        Protocol::Binary => (
            Box::new(TBinaryInputProtocol::new(r, true)),
            Box::new(TBinaryOutputProtocol::new(w, true)),
        ),
        Protocol::Compact => (
            Box::new(TCompactInputProtocol::new(r)),
            Box::new(TCompactOutputProtocol::new(w)),
        ),
    };
    FoqsSyncClient::new(i, o)
}

/// An item to enqueue with every optional field absent (so the namespace's defaults
/// apply). Prefer it to `EnqueueItem::default()`: the generated `Default` sets optional
/// numbers to `Some(0)`, and foqsd refuses a zero lease or TTL.
pub fn new_item(
    ns: &str,
    topic: &str,
    priority: i32,
    payload: Vec<u8>,
) -> crate::thrift_gen::EnqueueItem {
    crate::thrift_gen::EnqueueItem {
        ns: Some(ns.to_string()),
        topic: Some(topic.to_string()),
        priority: Some(priority),
        payload: Some(payload),
        metadata: None,
        deliver_after_ms: None,
        lease_ms: None,
        ttl_ms: None,
        policy: None,
        max_attempts: None,
        dedup_key: None,
    }
}
