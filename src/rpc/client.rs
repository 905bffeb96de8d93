//! A blocking Thrift client for foqsd (the generated client over framed binary or compact
//! protocol on a TCP socket), for tools, benchmarks and tests written in Rust.

use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use thrift::protocol::{
    TBinaryInputProtocol, TBinaryOutputProtocol, TCompactInputProtocol, TCompactOutputProtocol,
    TInputProtocol, TOutputProtocol,
};
use thrift::transport::{TFramedReadTransport, TFramedWriteTransport, TIoChannel, TTcpChannel};

pub use crate::rpc::Protocol;
use crate::thrift_gen::FoqsSyncClient;

pub type InputProtocol = Box<dyn TInputProtocol + Send>;
pub type OutputProtocol = Box<dyn TOutputProtocol + Send>;
/// Use it through the generated `TFoqsSyncClient` trait.
pub type SyncClient = FoqsSyncClient<InputProtocol, OutputProtocol>;

/// Connects to foqsd at `addr`; every call then waits at most `timeout` for its reply.
pub fn connect(
    addr: impl ToSocketAddrs,
    protocol: Protocol,
    timeout: Duration,
) -> thrift::Result<SyncClient> {
    let stream = tcp(addr, timeout)?;
    let (r, w) = TTcpChannel::with_stream(stream).split()?;
    Ok(client(
        TFramedReadTransport::new(r),
        TFramedWriteTransport::new(w),
        protocol,
    ))
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
    let stream = tcp(addr, timeout)?;
    let tls = crate::tls::SyncTlsStream::connect(stream, addr, tls)
        .map_err(|e| thrift::Error::from(std::io::Error::other(e.to_string())))?;
    Ok(client(
        TFramedReadTransport::new(tls.clone()),
        TFramedWriteTransport::new(tls),
        protocol,
    ))
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
    R: thrift::transport::TReadTransport + Send + 'static,
    W: thrift::transport::TWriteTransport + Send + 'static,
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
