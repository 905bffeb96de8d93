//! The network edge: a tokio accept loop with a connection cap, one task per connection,
//! Thrift framed transport (4-byte big-endian length, then the message), and graceful
//! shutdown: stop accepting, let each connection finish the request it is serving, then
//! return so the caller can flush the shards.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

use crate::core::Host;
use crate::rpc::{self, Outcome};

#[derive(Debug, Clone)]
pub struct ServerLimits {
    pub max_frame_bytes: usize,
    pub max_connections: usize,
    /// How long shutdown waits for connections to finish their current request.
    pub shutdown_grace_ms: u64,
}

/// Serves until `shutdown` turns true, then waits for open connections to finish their
/// current request and close.
pub async fn serve(
    listener: TcpListener,
    host: Arc<Host>,
    limits: ServerLimits,
    mut shutdown: watch::Receiver<bool>,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        // Waiting for a permit before accepting leaves excess clients in the kernel's
        // backlog: the cap is backpressure, not a refusal.
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => p.expect("semaphore is never closed"),
            _ = shutdown.changed() => break,
        };
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Typically EMFILE: back off a little rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => break,
        };
        let host = host.clone();
        let limits = limits.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            if let Err(e) = connection(stream, peer, &host, &limits, shutdown).await {
                tracing::debug!(%peer, error = %e, "connection ended");
            }
            drop(permit);
        });
    }
    drop(listener);
    tracing::info!("stopped accepting; waiting for open connections to finish");
    let grace = std::time::Duration::from_millis(limits.shutdown_grace_ms);
    if tokio::time::timeout(grace, permits.acquire_many(limits.max_connections as u32))
        .await
        .is_err()
    {
        // A client stuck mid-frame must not hold the host hostage; its request, if it
        // ever completes, gets UNAVAILABLE from the stopped shards.
        tracing::warn!(
            grace_ms = limits.shutdown_grace_ms,
            "connections still open after the shutdown grace period"
        );
    }
}

async fn connection(
    mut stream: TcpStream,
    peer: SocketAddr,
    host: &Host,
    limits: &ServerLimits,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let mut frame = Vec::new();
    loop {
        if *shutdown.borrow() {
            return Ok(());
        }
        let mut len = [0u8; 4];
        // Between requests a connection may be closed for shutdown; during one, never.
        tokio::select! {
            r = stream.read_exact(&mut len) => { r?; }
            _ = shutdown.changed() => return Ok(()),
        }
        let len = i32::from_be_bytes(len);
        // Also rejects unframed clients: a strict binary header 0x80 0x01 ... reads as a
        // negative length.
        if len <= 0 || len as usize > limits.max_frame_bytes {
            tracing::warn!(%peer, len, max = limits.max_frame_bytes, "bad frame length; closing the connection");
            return Ok(());
        }
        frame.resize(len as usize, 0);
        stream.read_exact(&mut frame).await?;
        match rpc::handle(&frame, host).await {
            Outcome::Reply(msg) => {
                let mut out = Vec::with_capacity(msg.len() + 4);
                out.extend_from_slice(&(msg.len() as u32).to_be_bytes());
                out.extend_from_slice(&msg);
                stream.write_all(&out).await?;
            }
            Outcome::Close(why) => {
                tracing::warn!(%peer, why, "undecodable message; closing the connection");
                return Ok(());
            }
        }
        // Do not keep a 16 MiB buffer alive for a connection that sent one large request.
        if frame.capacity() > 1 << 20 {
            frame = Vec::new();
        }
    }
}
