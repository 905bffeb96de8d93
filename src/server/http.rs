//! The operators' HTTP listener (`[metrics] listen`): `GET /metrics` (Prometheus text
//! format), `GET /healthz` (200 while the process runs) and `GET /readyz` (200 when this
//! host can serve now: at least one healthy shard, or a reachable peer to forward to;
//! 503 with the reason otherwise). Served by axum and hyper with the listeners' limits
//! (`http_serve`); nothing here parses HTTP by hand.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::core::Host;

/// Serves until `shutdown` turns true.
pub async fn serve_http(
    listener: TcpListener,
    host: Arc<Host>,
    limits: super::HttpLimits,
    shutdown: watch::Receiver<bool>,
) {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .with_state(host);
    super::http_serve::serve_router(listener, app, "metrics", limits, shutdown).await
}

async fn metrics(State(host): State<Arc<Host>>) -> impl IntoResponse {
    host.refresh_metrics();
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        host.metrics().encode(),
    )
}

async fn ready(State(host): State<Arc<Host>>) -> impl IntoResponse {
    match host.readiness() {
        Ok(why) => (StatusCode::OK, format!("ready: {why}\n")),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        ),
    }
}
