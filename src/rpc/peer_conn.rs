//! [`PeerClient`]: framed binary Thrift calls to other hosts on pooled TCP (or TLS)
//! connections: one `bb8` pool per peer address, created on first use; a call abandoned
//! half-way leaves its connection marked broken, and the pool drops it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use thrift::protocol::{
    TBinaryInputProtocol, TBinaryOutputProtocol, TInputProtocol, TMessageIdentifier, TMessageType,
    TOutputProtocol,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{config_for, describe};
use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// Largest reply frame accepted from a peer (a full dequeue-sized reply fits many times).
const REPLY_FRAME_BYTES_MAX: usize = 64 * 1024 * 1024;

pub struct PeerClient {
    pools: Mutex<HashMap<String, bb8::Pool<Connector>>>,
    connections_max: u32,
    timeout: Duration,
    /// TLS towards peers (`cluster.tls_*`); `None`: plain TCP.
    tls: Option<tokio_rustls::TlsConnector>,
    /// `None`: peers know this host by its certificate alone.
    login: Option<Arc<PeerLogin>>,
    metrics: Arc<Metrics>,
}

struct Connector {
    addr: String,
    timeout: Duration,
    tls: Option<tokio_rustls::TlsConnector>,
    login: Option<Arc<PeerLogin>>,
}

/// How this host logs in to its peers (`peerLogin`, `cluster.peer_secret`): the first
/// call on every connection, so that the peer serves it the calls only hosts may make.
pub struct PeerLogin {
    host_id: String,
    secret: Vec<u8>,
}

impl PeerLogin {
    pub fn new(host_id: String, secret: Vec<u8>) -> PeerLogin {
        PeerLogin { host_id, secret }
    }

    /// Sends the login on a new connection and reads its answer.
    async fn log_in(&self, stream: &mut dyn PeerIo) -> std::io::Result<()> {
        let args = crate::thrift_gen::FoqsPeerLoginArgs {
            req: crate::thrift_gen::PeerLoginRequest {
                host_id: Some(self.host_id.clone()),
                secret: Some(self.secret.clone()),
            },
        };
        let frame = encode("peerLogin", 0, |o| args.write_to_out_protocol(o))
            .map_err(|e| std::io::Error::other(describe(&e)))?;
        let reply = exchange(stream, &frame).await?;
        let refused = decode(&reply, |i| {
            crate::thrift_gen::FoqsPeerLoginResult::read_from_in_protocol(i)
        })
        .map_err(|e| std::io::Error::other(describe(&e)))?
        .err;
        match refused {
            None => Ok(()),
            Some(e) => {
                let why = e.message.unwrap_or_default();
                // A wrong or missing secret on one side: every call to that peer fails
                // until the configs agree, so say it where operators look.
                tracing::warn!(error = %why, "a peer refused this host's peerLogin");
                Err(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    format!("peerLogin refused: {why}"),
                ))
            }
        }
    }
}

/// Writes one framed message and reads the framed reply.
async fn exchange(stream: &mut (dyn PeerIo + '_), frame: &[u8]) -> std::io::Result<Vec<u8>> {
    stream.write_all(frame).await?;
    // TLS buffers what it encrypts: push it out.
    stream.flush().await?;
    let len = stream.read_i32().await?;
    if len <= 0 || len as usize > REPLY_FRAME_BYTES_MAX {
        return Err(std::io::Error::other(format!("reply frame of {len} bytes")));
    }
    let mut reply = vec![0u8; len as usize];
    stream.read_exact(&mut reply).await?;
    Ok(reply)
}

/// A peer connection's byte stream: plain TCP or TLS.
trait PeerIo: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> PeerIo for T {}

struct Conn {
    stream: Box<dyn PeerIo>,
    /// Set while a call is in flight: a call abandoned half-way (timeout) leaves the
    /// stream out of step, and the pool then drops it.
    broken: bool,
    seq: i32,
}

impl bb8::ManageConnection for Connector {
    type Connection = Conn;
    type Error = std::io::Error;

    async fn connect(&self) -> std::io::Result<Conn> {
        let timed_out = || std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out");
        let stream = tokio::time::timeout(self.timeout, TcpStream::connect(&self.addr))
            .await
            .map_err(|_| timed_out())??;
        stream.set_nodelay(true)?;
        let stream: Box<dyn PeerIo> = match &self.tls {
            None => Box::new(stream),
            Some(tls) => {
                let name = crate::tls::server_name(&self.addr)
                    .map_err(|e| std::io::Error::other(e.to_string()))?;
                let s = tokio::time::timeout(self.timeout, tls.connect(name, stream))
                    .await
                    .map_err(|_| timed_out())??;
                Box::new(s)
            }
        };
        let mut stream = stream;
        if let Some(login) = &self.login {
            tokio::time::timeout(self.timeout, login.log_in(&mut *stream))
                .await
                .map_err(|_| timed_out())??;
        }
        Ok(Conn {
            stream,
            broken: false,
            seq: 0,
        })
    }

    async fn is_valid(&self, conn: &mut Conn) -> std::io::Result<()> {
        if conn.broken {
            return Err(std::io::Error::other("broken"));
        }
        // An idle connection has nothing to read: one that is readable was closed by the
        // peer (it restarted, or died: its kernel sent FIN or RST), or is out of step.
        // Without this look, the next call wrote into it and read EOF, and a forwarded
        // call the peer never received was answered outcome_unknown.
        let mut byte = [0u8; 1];
        match futures::FutureExt::now_or_never(conn.stream.read(&mut byte)) {
            None => Ok(()),
            Some(Ok(0)) => Err(std::io::Error::other("closed by the peer")),
            Some(Ok(_)) => Err(std::io::Error::other(
                "unexpected bytes on an idle connection",
            )),
            Some(Err(e)) => Err(e),
        }
    }

    fn has_broken(&self, conn: &mut Conn) -> bool {
        conn.broken
    }
}

impl PeerClient {
    pub fn new(
        connections_max: u32,
        timeout: Duration,
        tls: Option<Arc<rustls::ClientConfig>>,
        login: Option<PeerLogin>,
        metrics: Arc<Metrics>,
    ) -> PeerClient {
        PeerClient {
            pools: Mutex::new(HashMap::new()),
            connections_max: connections_max.max(1),
            timeout,
            tls: tls.map(tokio_rustls::TlsConnector::from),
            login: login.map(Arc::new),
            metrics,
        }
    }

    fn pool(&self, addr: &str) -> bb8::Pool<Connector> {
        let mut pools = self.pools.lock().expect("not poisoned");
        pools
            .entry(addr.to_string())
            .or_insert_with(|| {
                bb8::Pool::builder()
                    .max_size(self.connections_max)
                    .connection_timeout(self.timeout)
                    .build_unchecked(Connector {
                        addr: addr.to_string(),
                        timeout: self.timeout,
                        tls: self.tls.clone(),
                        login: self.login.clone(),
                    })
            })
            .clone()
    }

    /// One call: `args` writes the method's arguments struct, `result` reads its result
    /// struct. Every failure to reach the peer is `UNAVAILABLE` (retryable).
    pub(super) async fn call<R>(
        &self,
        addr: &str,
        method: &'static str,
        args: impl FnOnce(&mut dyn TOutputProtocol) -> thrift::Result<()>,
        result: impl FnOnce(&mut dyn TInputProtocol) -> thrift::Result<R>,
    ) -> Result<R> {
        let r = self.call_once(addr, method, args, result).await;
        let outcome = match &r {
            Ok(_) => "ok",
            Err(_) => "unavailable",
        };
        self.metrics.forwarded(addr, method, outcome);
        r
    }

    async fn call_once<R>(
        &self,
        addr: &str,
        method: &'static str,
        args: impl FnOnce(&mut dyn TOutputProtocol) -> thrift::Result<()>,
        result: impl FnOnce(&mut dyn TInputProtocol) -> thrift::Result<R>,
    ) -> Result<R> {
        let unavailable = |why: String| Error::unavailable(format!("peer {addr}: {why}"));
        let doubt = |why: String| {
            Error::in_doubt(format!(
                "peer {addr}: {why}{}",
                crate::error::SENT_OUTCOME_UNKNOWN
            ))
        };
        let mut sent = false;
        let pool = self.pool(addr);
        let work = async {
            let mut conn = pool
                .get()
                .await
                .map_err(|e| unavailable(format!("{e:?}")))?;
            conn.seq = conn.seq.wrapping_add(1);
            let frame = encode(method, conn.seq, args).map_err(|e| unavailable(describe(&e)))?;
            conn.broken = true;
            // From the first byte written on, the peer may act on the call: a failure
            // is in doubt (the peer may have applied it), not a refusal.
            sent = true;
            let reply = exchange(&mut *conn.stream, &frame)
                .await
                .map_err(|e| doubt(e.to_string()))?;
            conn.broken = false;
            decode(&reply, result).map_err(|e| doubt(describe(&e)))
        };
        tokio::time::timeout(self.timeout, work)
            .await
            .map_err(|_| {
                let why = format!("no answer within {} ms", self.timeout.as_millis());
                if sent {
                    doubt(why)
                } else {
                    unavailable(why)
                }
            })?
    }
}

fn encode(
    method: &str,
    seq: i32,
    args: impl FnOnce(&mut dyn TOutputProtocol) -> thrift::Result<()>,
) -> thrift::Result<Vec<u8>> {
    let mut buf = vec![0u8; 4];
    {
        let mut o = TBinaryOutputProtocol::new(&mut buf, true);
        o.write_message_begin(&TMessageIdentifier::new(method, TMessageType::Call, seq))?;
        args(&mut o)?;
        o.write_message_end()?;
        o.flush()?;
    }
    let len = (buf.len() - 4) as i32;
    buf[..4].copy_from_slice(&len.to_be_bytes());
    Ok(buf)
}

fn decode<R>(
    frame: &[u8],
    result: impl FnOnce(&mut dyn TInputProtocol) -> thrift::Result<R>,
) -> thrift::Result<R> {
    let mut i = TBinaryInputProtocol::with_config(frame, true, config_for(frame.len()));
    let ident = i.read_message_begin()?;
    if ident.message_type == TMessageType::Exception {
        let e = thrift::Error::read_application_error_from_in_protocol(&mut i)?;
        return Err(thrift::Error::Application(e));
    }
    let r = result(&mut i)?;
    i.read_message_end()?;
    Ok(r)
}
