//! Serving the operators' HTTP listeners (metrics and health, the web console) with the
//! limits every listener has: `axum::serve` sets no timer, so hyper drops its header-read
//! timeout, and it has no idle deadline and no connection cap; a client that opened
//! connections and never finished a request head held their descriptors (shared with the
//! Thrift port and the databases) for ever.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

/// The limits of one operators' HTTP listener (`server.http_*`).
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    /// A request head must arrive whole within this long.
    pub header_timeout: Duration,
    /// A connection on which nothing was read for this long is closed.
    pub idle_timeout: Duration,
    /// Connections open at once; past it new ones are closed at once.
    pub connections_max: usize,
}

/// A reply not taken by the client within this long closes the connection.
const HTTP_WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves `app` on `listener` until `shutdown` turns true; `what` names the listener in
/// logs. In-flight requests get the header timeout to finish after the shutdown.
pub async fn serve_router(
    listener: TcpListener,
    app: Router,
    what: &'static str,
    limits: HttpLimits,
    mut shutdown: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(limits.connections_max));
    let mut refused: u64 = 0;
    let (stop_tx, stop_rx) = watch::channel(false);
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.changed() => break,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of descriptors, say: wait a little rather than spin.
                    tracing::warn!(listener = what, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            refused += 1;
            // Said once per power of two, so that a flood does not flood the log.
            if refused.is_power_of_two() {
                tracing::warn!(listener = what, %peer, refused, max = limits.connections_max,
                    "connection refused: the listener is at its connection cap");
            }
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let mut timed = tokio_io_timeout::TimeoutStream::new(stream);
        timed.set_read_timeout(Some(limits.idle_timeout));
        timed.set_write_timeout(Some(HTTP_WRITE_TIMEOUT));
        // The client's address reaches handlers as axum's ConnectInfo (the console bounds
        // logins per address).
        let app = app.clone();
        let service = hyper::service::service_fn(move |mut req: hyper::Request<_>| {
            req.extensions_mut()
                .insert(axum::extract::ConnectInfo(peer));
            let mut app = app.clone();
            async move { tower_service::Service::call(&mut app, req).await }
        });
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout);
            let conn = builder.serve_connection(TokioIo::new(Box::pin(timed)), service);
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!(listener = what, %peer, error = %e, "connection ended");
                    }
                }
                _ = stop.changed() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(limits.header_timeout, conn).await;
                }
            }
        });
    }
    let _ = stop_tx.send(true);
    drop(listener);
}
