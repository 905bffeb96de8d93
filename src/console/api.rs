//! The console's JSON API (`/api/v1/`): the data of each page, for the pages' scripts
//! (the chart) and for operators' own. Errors are `{"error": {"code", "message"}}` with
//! an HTTP status that matches the code. State changes are POSTs with a JSON body (see
//! the module above for the origin rule).

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

use super::data::TopicQuery;
use super::Console;
use crate::error::Error;

type C = State<Arc<Console>>;

pub fn routes() -> Router<Arc<Console>> {
    Router::new()
        .route("/overview", get(overview))
        .route("/series", get(series))
        .route("/namespaces", get(namespaces))
        .route("/namespaces/{ns}/topics", get(topics))
        .route("/namespaces/{ns}/topics/{topic}", get(topic))
        .route("/namespaces/{ns}/topics/{topic}/enqueue", post(enqueue))
        .route("/namespaces/{ns}/topics/{topic}/dlq", get(dlq))
        .route("/dlq/requeue", post(requeue))
        .route(
            "/namespaces/{ns}/topics/{topic}/dlq/requeue-all",
            post(requeue_all),
        )
        .route("/namespaces/{ns}/topics/{topic}/dlq/purge", post(purge))
        .route("/cluster", get(cluster))
        .fallback(|| async {
            err(Error::not_found(
                "no such API call (see docs/operations.md, \"Web console\")",
            ))
        })
        .layer(axum::middleware::map_response(json_errors))
}

/// axum's own refusals (a malformed body, query or path) are text: made JSON like the
/// rest, `{"error": {"code": <HTTP reason>, "message": <axum's text>}}`.
async fn json_errors(r: Response) -> Response {
    let is_json = r
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let status = r.status();
    if is_json || !(status.is_client_error() || status.is_server_error()) {
        return r;
    }
    let (parts, body) = r.into_parts();
    let text = axum::body::to_bytes(body, 64 * 1024)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let mut out = (
        status,
        Json(json!({"error": {"code": status.canonical_reason().unwrap_or("Error"), "message": text}})),
    )
        .into_response();
    // The original's other headers (Allow on a 405, say) stay.
    for (k, v) in &parts.headers {
        if k != axum::http::header::CONTENT_TYPE && k != axum::http::header::CONTENT_LENGTH {
            out.headers_mut().insert(k.clone(), v.clone());
        }
    }
    out
}

fn err(e: Error) -> Response {
    let status = super::pages::status_of(&e);
    (
        status,
        Json(json!({"error": {"code": format!("{:?}", e.code), "message": e.message}})),
    )
        .into_response()
}

fn ok<T: serde::Serialize>(r: crate::error::Result<T>) -> Response {
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => err(e),
    }
}

async fn overview(State(c): C) -> Response {
    Json(c.overview()).into_response()
}

async fn series(State(c): C) -> Response {
    Json(c.series.view()).into_response()
}

async fn namespaces(State(c): C) -> Response {
    Json(json!({"namespaces": c.namespaces()})).into_response()
}

async fn topics(State(c): C, Path(ns): Path<String>, Query(q): Query<TopicQuery>) -> Response {
    ok(c.topics(&ns, &q, false))
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct PeekQuery {
    count: Option<i32>,
}

async fn topic(
    State(c): C,
    Path((ns, topic)): Path<(String, String)>,
    Query(q): Query<PeekQuery>,
) -> Response {
    ok(c.topic(&ns, &topic, q.count).await)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EnqueueBody {
    /// UTF-8 text.
    payload: String,
    #[serde(default)]
    priority: i32,
    #[serde(default)]
    delay_ms: i64,
}

async fn enqueue(
    State(c): C,
    Path((ns, topic)): Path<(String, String)>,
    Json(b): Json<EnqueueBody>,
) -> Response {
    ok(
        c.enqueue_test(&ns, &topic, b.payload.into_bytes(), b.priority, b.delay_ms)
            .await
            .map(|id| json!({"id": id})),
    )
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct DlqQuery {
    after: Option<String>,
    limit: Option<i32>,
}

async fn dlq(
    State(c): C,
    Path((ns, topic)): Path<(String, String)>,
    Query(q): Query<DlqQuery>,
) -> Response {
    ok(c.dlq(&ns, &topic, q.after, q.limit).await)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct IdsBody {
    ids: Vec<String>,
}

/// Requeues dead items by id (ids name their shard, so no topic is needed); each id
/// succeeds or fails alone.
async fn requeue(State(c): C, Json(b): Json<IdsBody>) -> Response {
    ok(c.dlq_requeue(&b.ids).await.map(|failed| {
        let failed: Vec<_> = failed
            .into_iter()
            .map(|(id, e)| json!({"id": id, "code": format!("{:?}", e.code), "message": e.message}))
            .collect();
        json!({"requeued": b.ids.len() - failed.len(), "failed": failed})
    }))
}

async fn requeue_all(State(c): C, Path((ns, topic)): Path<(String, String)>) -> Response {
    ok(c.dlq_requeue_all(&ns, &topic).await.map(progress))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PurgeBody {
    /// The topic's name again: nothing is purged without it.
    confirm: String,
}

async fn purge(
    State(c): C,
    Path((ns, topic)): Path<(String, String)>,
    Json(b): Json<PurgeBody>,
) -> Response {
    ok(c.dlq_purge(&ns, &topic, &b.confirm).await.map(progress))
}

fn progress(p: crate::model::Progress) -> serde_json::Value {
    json!({"count": p.count, "more": p.more})
}

async fn cluster(State(c): C) -> Response {
    Json(c.cluster()).into_response()
}
