//! The network edge: a tokio accept loop, one task per connection, optional TLS, every
//! Thrift transport a client library may default to (framed, unframed, THeader, HTTP;
//! detected per connection by [`crate::wire`], inside TLS on a TLS port), and graceful shutdown:
//! stop accepting, let each connection finish the request it is serving, then return so
//! the caller can flush the shards.
//!
//! Connections are a resource with limits, so that one careless client cannot take them
//! all: a TLS handshake must finish within `handshake_timeout_ms`, a frame that has started
//! within `frame_read_timeout_ms` (and a reply must be taken by the client within it too),
//! and a connection with no request for `idle_timeout_ms` is closed. At the connection cap
//! the connection that has waited longest without a request in progress gives way to the
//! new one ([`ConnTable`]); only when every connection is busy with a request (a long poll
//! counts as one) does a new connection wait.

mod conns;
mod http;
mod http_serve;
mod listen;
mod pace;
pub mod session;

pub use listen::listen;

/// Log lines a second about connections (opened with TLS, closed by foqsd, refused).
const CONNECTION_LOG_LINES_PER_SECOND: u32 = 20;

/// How long a new connection waits at the cap for the one that gives way to close.
const EVICT_WAIT_MAX: Duration = Duration::from_secs(1);
/// New connections waiting at the cap for a slot, at most (one per address); past it one
/// is refused at once.
const SLOT_WAITERS_MAX: usize = 64;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

pub use conns::{ConnState, ConnTable};
pub use http::serve_http;
pub use http_serve::{serve_router, HttpLimits};

use crate::core::{Caller, Hangup, Host};
use crate::metrics::Metrics;
use crate::wire::{Decoder, Next};
use session::Step;

#[derive(Debug, Clone)]
pub struct ServerLimits {
    pub max_frame_bytes: usize,
    pub max_connections: usize,
    /// How long shutdown waits for connections to finish their current request.
    pub shutdown_grace_ms: u64,
    pub frame_read_timeout_ms: u64,
    pub idle_timeout_ms: u64,
    pub handshake_timeout_ms: u64,
    /// Connections one address may hold (`server.connections_per_address_max`).
    pub connections_per_address_max: usize,
    /// Connections one TLS identity may hold (`server.connections_per_identity_max`).
    pub connections_per_identity_max: usize,
}

/// Why a connection ended, for the logs and the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Closed,
    Idle,
    FrameTimeout,
    HandshakeTimeout,
    Evicted,
    Shutdown,
    Refused,
    /// The input is not a request foqs serves (the reason is the metrics label).
    Protocol(&'static str),
}

impl End {
    fn label(self) -> &'static str {
        match self {
            End::Closed => "closed",
            End::Idle => "idle_timeout",
            End::FrameTimeout => "frame_timeout",
            End::HandshakeTimeout => "handshake_timeout",
            End::Evicted => "evicted",
            End::Shutdown => "shutdown",
            End::Refused => "refused",
            End::Protocol(reason) => reason,
        }
    }
}

/// What every connection task shares.
struct Edge {
    host: Arc<Host>,
    limits: ServerLimits,
    tls: Option<crate::tls::ServerTls>,
    table: Arc<ConnTable>,
    metrics: Arc<Metrics>,
    /// New connections refused for want of a slot (for the log's pacing).
    refused: std::sync::atomic::AtomicU64,
    /// New connections waiting at the cap for a slot.
    slot_waiters: SlotWaiters,
    /// The pace of the log lines clients can cause (see `pace`).
    log_pace: pace::LogPace,
}

/// Serves until `shutdown` turns true, then waits for open connections to finish their
/// current request and close.
pub async fn serve(
    listener: TcpListener,
    host: Arc<Host>,
    limits: ServerLimits,
    tls: Option<crate::tls::ServerTls>,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let edge = Arc::new(Edge {
        host,
        limits: limits.clone(),
        tls,
        table: Arc::new(ConnTable::default()),
        metrics,
        refused: Default::default(),
        slot_waiters: Default::default(),
        log_pace: pace::LogPace::new(CONNECTION_LOG_LINES_PER_SECOND),
    });
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Typically EMFILE: back off a little rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => break,
        };
        // An address at its own cap: one of its connections gives way (the others'
        // are not its to take); when all of them are writing answers, refused.
        let ip = peer.ip();
        // One eviction per new connection: the address's own when it is at its cap (that
        // frees a slot under the global cap too), else another when the host is full.
        let mut evicted = false;
        if edge.table.count_of(ip) >= limits.connections_per_address_max {
            if !edge.table.evict_one(Some(ip)) {
                refuse(&edge, peer, "address_cap");
                continue;
            }
            edge.metrics.connection_evicted();
            evicted = true;
        }
        let permit = match permits.clone().try_acquire_owned() {
            Ok(p) => Some(p),
            Err(_) => {
                // At the cap: an idle connection gives way, else the longest waiting
                // request (a long poll is answered empty and closed). When every
                // connection is writing an answer, the new one is refused at once: the
                // listen backlog must not fill. The new one waits for the slot in its own
                // task (the one giving way may be a slow request, not a long poll): the
                // accept loop goes on meanwhile. One such waiter per address, so that an
                // address cannot push out other clients' connections many at a time.
                if !edge.slot_waiters.enter(ip) {
                    refuse(&edge, peer, "connection_cap");
                    continue;
                }
                if !evicted && !edge.table.evict_one(None) {
                    edge.slot_waiters.leave(ip);
                    refuse(&edge, peer, "connection_cap");
                    continue;
                }
                if !evicted {
                    edge.metrics.connection_evicted();
                }
                None
            }
        };
        // Registered here when it has its slot, not in the task: the next accept counts
        // it for its address.
        let slot = permit.as_ref().map(|_| edge.table.register(ip));
        let edge = edge.clone();
        let mut shutdown = shutdown.clone();
        let permits = permits.clone();
        tokio::spawn(async move {
            let (permit, slot) = match (permit, slot) {
                (Some(p), Some(s)) => (p, s),
                _ => {
                    let got = tokio::select! {
                        p = permits.acquire_owned() => p.ok(),
                        _ = tokio::time::sleep(EVICT_WAIT_MAX) => None,
                        _ = shutdown.changed() => None,
                    };
                    edge.slot_waiters.leave(ip);
                    match got {
                        Some(p) => (p, edge.table.register(ip)),
                        None => return refuse(&edge, peer, "connection_cap"),
                    }
                }
            };
            edge.metrics.connections_open.inc();
            let end = match connect(stream, peer, &edge, &slot, shutdown).await {
                Ok(end) => end,
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "connection ended");
                    End::Closed
                }
            };
            if end != End::Closed && end != End::Shutdown {
                if let Some(skipped) = edge.log_pace.allow() {
                    tracing::info!(%peer, why = end.label(), skipped, "connection closed by foqsd");
                }
            }
            edge.metrics.connection_ended(end.label());
            edge.metrics.connections_open.dec();
            drop(slot);
            drop(permit);
        });
    }
    drop(listener);
    drain(permits, &limits).await;
}

/// New connections waiting at the cap for the slot of one giving way: at most one per
/// address and [`SLOT_WAITERS_MAX`] in all.
#[derive(Default)]
struct SlotWaiters(std::sync::Mutex<std::collections::HashSet<std::net::IpAddr>>);

impl SlotWaiters {
    /// A place for a connection from `ip` to wait, if there is one.
    fn enter(&self, ip: std::net::IpAddr) -> bool {
        let mut w = self.0.lock().expect("not poisoned");
        w.len() < SLOT_WAITERS_MAX && w.insert(ip)
    }

    fn leave(&self, ip: std::net::IpAddr) {
        self.0.lock().expect("not poisoned").remove(&ip);
    }
}

/// Closes a new connection at once (no slot for it), counted by `reason`; logged once per
/// power of two, so that a flood does not flood the log.
fn refuse(edge: &Edge, peer: SocketAddr, reason: &'static str) {
    edge.metrics.connection_ended(reason);
    let n = edge
        .refused
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        + 1;
    if n.is_power_of_two() {
        tracing::warn!(%peer, reason, refused = n, "connection refused: no slot for it");
    }
}

/// Waits (up to the grace period) for open connections to finish their current request.
async fn drain(permits: Arc<Semaphore>, limits: &ServerLimits) {
    tracing::info!("stopped accepting; waiting for open connections to finish");
    let grace = Duration::from_millis(limits.shutdown_grace_ms);
    if tokio::time::timeout(grace, permits.acquire_many(limits.max_connections as u32))
        .await
        .is_err()
    {
        // A client stuck mid-request must not hold the host hostage; its request, if it
        // ever completes, gets UNAVAILABLE from the stopped shards.
        tracing::warn!(
            grace_ms = limits.shutdown_grace_ms,
            "connections still open after the shutdown grace period"
        );
    }
}

/// Completes the TLS handshake when the port speaks TLS, learns the caller's identity,
/// and serves the connection.
async fn connect(
    stream: TcpStream,
    peer: SocketAddr,
    edge: &Edge,
    slot: &conns::ConnSlot,
    shutdown: watch::Receiver<bool>,
) -> std::io::Result<End> {
    stream.set_nodelay(true)?;
    let Some(tls) = &edge.tls else {
        let caller = Caller::anonymous();
        tracing::debug!(%peer, identity = ?caller.identity, "connection");
        return serve_connection(stream, peer, edge, slot, &caller, shutdown).await;
    };
    let handshake = Duration::from_millis(edge.limits.handshake_timeout_ms);
    let stream = tokio::select! {
        r = tokio::time::timeout(handshake, tls.acceptor.accept(stream)) => match r {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                // A certificate from another CA, a plain-TCP client, a scanner.
                if let Some(skipped) = edge.log_pace.allow() {
                    tracing::info!(%peer, error = %e, skipped, "TLS handshake failed");
                }
                return Ok(End::Refused);
            }
            Err(_) => return Ok(End::HandshakeTimeout),
        },
        _ = slot.kick.notified() => return Ok(End::Evicted),
    };
    let identity = crate::tls::identity(stream.get_ref().1.peer_certificates());
    // One identity, whatever its addresses, within its own cap: past it one of its own
    // connections gives way (this one, when the others are all writing answers).
    if identity != crate::tls::ANONYMOUS {
        slot.set_identity(&identity);
        if edge.table.count_of_identity(&identity) > edge.limits.connections_per_identity_max
            && edge.table.evict_one_of_identity(&identity)
        {
            edge.metrics.connection_evicted();
        }
    }
    // Debug-formatted: an identity is the client's text, and must not forge log lines.
    if let Some(skipped) = edge.log_pace.allow() {
        tracing::info!(%peer, identity = ?identity, skipped, "TLS connection");
    }
    let mut caller = Caller::new(identity);
    if tls.is_peer_certificate(stream.get_ref().1.peer_certificates()) {
        caller = caller.with_peer_certificate();
    }
    serve_connection(stream, peer, edge, slot, &caller, shutdown).await
}

/// Replies up to this size are written joined to their framing, in one write.
const WRITE_JOINED_MAX: usize = 64 * 1024;
/// Most bytes read from the socket at once.
const READ_CHUNK: usize = 64 * 1024;
/// What an idle connection's buffer holds room for: a typical request in one read,
/// without 64 KiB per idle connection.
const IDLE_BYTES: usize = 4096;
/// Most bytes read while a request is being served (the start of a pipelined request).
const EARLY_BYTES: usize = 4096;
/// After answering with a refusal, how long (and how much of) the client's input is read
/// and dropped before the close, so that the kernel does not reset the connection (and
/// the answer with it) over unread bytes.
const LINGER: Duration = Duration::from_secs(1);
const LINGER_BYTES: u64 = 64 * 1024;

/// The bytes read and not yet answered: `buf[start..]`. Answered requests are skipped
/// by moving `start`, so pipelined requests are not shifted down one by one; the buffer
/// is compacted only before it is read into again.
struct Inbox {
    buf: Vec<u8>,
    start: usize,
}

impl Inbox {
    fn pending(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    fn consume(&mut self, n: usize) {
        self.start += n;
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
            // Do not keep a large buffer alive for a connection that sent one large request.
            if self.buf.capacity() > 2 * READ_CHUNK {
                self.buf.shrink_to(IDLE_BYTES);
            }
        }
    }

    /// Reads what the socket has (at most [`READ_CHUNK`], and never past `max` pending);
    /// 0 at end of stream. The buffer grows with what arrives, so a client that announces
    /// a large request and sends nothing costs nothing.
    async fn read<S: AsyncRead + Unpin>(
        &mut self,
        stream: &mut S,
        max: usize,
    ) -> std::io::Result<usize> {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        let chunk = if self.buf.is_empty() {
            IDLE_BYTES
        } else {
            READ_CHUNK
        };
        let room = max.saturating_sub(self.buf.len()).clamp(1, chunk);
        self.buf.reserve(room);
        let mut limited = (&mut *stream).take(room as u64);
        limited.read_buf(&mut self.buf).await
    }
}

async fn serve_connection<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    peer: SocketAddr,
    edge: &Edge,
    slot: &conns::ConnSlot,
    caller: &Caller,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<End> {
    let limits = &edge.limits;
    let idle = Duration::from_millis(limits.idle_timeout_ms);
    let frame_timeout = Duration::from_millis(limits.frame_read_timeout_ms);
    let mut decoder = Decoder::new(limits.max_frame_bytes);
    let max = decoder.buffer_max();
    let mut counted = false;
    // A request that arrived with (pipelined behind) the previous one is already here.
    let mut inbox = Inbox {
        buf: Vec::with_capacity(IDLE_BYTES),
        start: 0,
    };
    let hangup = Arc::new(Hangup::default());
    // A peer logs in once per connection (peerLogin); the mark lives as long as it.
    let caller = caller
        .clone()
        .with_hangup(hangup.clone())
        .with_peer_mark(Arc::default())
        .with_origin(peer.ip());
    // What arrives while a request is being served (see below); allocated at the first
    // request that is not answered at once.
    let mut early: Vec<u8> = Vec::new();
    let mut early_len = 0;
    let mut peer_marked = false;
    loop {
        if *shutdown.borrow() {
            return Ok(End::Shutdown);
        }
        slot.set(ConnState::Idle);
        // Between requests a connection may be closed (shutdown, idle, eviction); once a
        // request has started, only its deadline or an eviction ends it.
        if inbox.pending().is_empty() {
            tokio::select! {
                // An eviction already asked for wins over a request arriving now.
                biased;
                _ = slot.kick.notified() => return Ok(End::Evicted),
                _ = shutdown.changed() => return Ok(End::Shutdown),
                r = inbox.read(&mut stream, max) => if r? == 0 { return Ok(End::Closed) },
                _ = tokio::time::sleep(idle) => return Ok(End::Idle),
            }
        }
        slot.set(ConnState::Reading);
        let deadline = tokio::time::Instant::now() + frame_timeout;
        let next = loop {
            match decoder.next(inbox.pending()) {
                Next::Need => {}
                // HTTP's 100 Continue: written, and the same request read on, under the
                // same deadline.
                Next::Interim(bytes) => {
                    let write = async {
                        stream.write_all(bytes).await?;
                        stream.flush().await
                    };
                    match tokio::time::timeout_at(deadline, write).await {
                        Ok(r) => r?,
                        Err(_) => return Ok(End::FrameTimeout),
                    }
                    continue;
                }
                other => break other,
            }
            if inbox.pending().len() >= max {
                // The decoder refuses what outgrows the limit before the buffer can.
                return Ok(End::Protocol("too_large"));
            }
            tokio::select! {
                r = inbox.read(&mut stream, max) => if r? == 0 { return Ok(End::Closed) },
                _ = tokio::time::sleep_until(deadline) => return Ok(End::FrameTimeout),
                _ = slot.kick.notified() => return Ok(End::Evicted),
            }
        };
        slot.set(ConnState::Busy);
        let mut evicted = false;
        let step = {
            let answer = session::answer(next, inbox.pending(), &edge.host, &caller);
            tokio::pin!(answer);
            // Most requests are answered at the first poll. One that waits (a long poll,
            // a slow shard) has the socket watched meanwhile for the client closing it,
            // which ends a long poll (see `Hangup`); the first bytes of a pipelined
            // request end the watch (they are kept for the next turn). The socket first:
            // a close that arrives with the wake of a long poll must win, or the poll
            // would take items for nobody.
            match futures::poll!(&mut answer) {
                std::task::Poll::Ready(step) => step,
                std::task::Poll::Pending => {
                    if early.is_empty() {
                        early.resize(EARLY_BYTES, 0);
                    }
                    let mut watching = true;
                    // A request not answered at once may give way at the connection cap
                    // (see `conns`): a long poll then ends as if its client had gone
                    // (answered empty, nothing taken for it), and the connection closes.
                    slot.set(ConnState::Waiting);
                    let step = loop {
                        tokio::select! {
                            biased;
                            r = stream.read(&mut early[..]), if watching => {
                                watching = false;
                                match r {
                                    Ok(0) | Err(_) => hangup.hang_up(),
                                    Ok(n) => early_len = n,
                                }
                            }
                            _ = slot.kick.notified(), if !evicted => {
                                evicted = true;
                                hangup.hang_up();
                            }
                            step = &mut answer => break step,
                        }
                    };
                    slot.set(ConnState::Busy);
                    step
                }
            }
        };
        if early_len > 0 {
            inbox.buf.extend_from_slice(&early[..early_len]);
            early_len = 0;
        }
        match step {
            Step::Write {
                bytes,
                consumed,
                close_after,
                envelope,
            } => {
                // A connection counts under the transport of its first request.
                if let (false, Some(e)) = (counted, &envelope) {
                    edge.metrics.connection_transport(e.transport().label());
                    counted = true;
                }
                // A client that does not take its reply holds a slot: bound it too. The
                // flush pushes out what TLS buffered (a plain socket has nothing to flush).
                let write = async {
                    // A large reply goes out behind its framing without being copied
                    // into one buffer with it; a small one in one write (one segment).
                    if bytes.body.len() > WRITE_JOINED_MAX {
                        stream.write_all(&bytes.head).await?;
                        stream.write_all(&bytes.body).await?;
                    } else {
                        stream.write_all(&bytes.into_vec()).await?;
                    }
                    stream.flush().await
                };
                match tokio::time::timeout(frame_timeout, write).await {
                    Ok(r) => r?,
                    Err(_) => return Ok(End::FrameTimeout),
                }
                inbox.consume(consumed);
                if !peer_marked && caller.logged_in_peer().is_some() {
                    slot.mark_peer();
                    peer_marked = true;
                }
                if close_after {
                    return Ok(End::Closed);
                }
                if evicted {
                    return Ok(End::Evicted);
                }
            }
            Step::Close {
                reason,
                detail,
                answer,
            } => {
                if let Some(skipped) = edge.log_pace.allow() {
                    tracing::warn!(%peer, why = ?detail, skipped, "refusing the connection's input; closing it");
                }
                if let Some(a) = answer {
                    let _ = tokio::time::timeout(LINGER, async {
                        stream.write_all(&a).await?;
                        stream.flush().await?;
                        stream.shutdown().await?;
                        let mut rest = (&mut stream).take(LINGER_BYTES);
                        tokio::io::copy(&mut rest, &mut tokio::io::sink()).await
                    })
                    .await;
                }
                return Ok(End::Protocol(reason));
            }
        }
    }
}
