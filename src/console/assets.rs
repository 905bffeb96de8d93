//! The console's static files, compiled into the binary. Their names carry their version
//! (vendored files) or are foqs's own, so they may be cached for a day.

use std::sync::Arc;

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::Console;

pub const HTMX: &str = "/static/htmx-2.0.11.min.js";
pub const UPLOT_JS: &str = "/static/uplot-1.6.32.iife.min.js";
pub const UPLOT_CSS: &str = "/static/uplot-1.6.32.min.css";
pub const CONSOLE_JS: &str = "/static/console.js";
pub const CONSOLE_CSS: &str = "/static/console.css";

const FILES: [(&str, &str, &[u8]); 5] = [
    (
        "htmx-2.0.11.min.js",
        "text/javascript; charset=utf-8",
        include_bytes!("static/htmx-2.0.11.min.js"),
    ),
    (
        "uplot-1.6.32.iife.min.js",
        "text/javascript; charset=utf-8",
        include_bytes!("static/uplot-1.6.32.iife.min.js"),
    ),
    (
        "uplot-1.6.32.min.css",
        "text/css; charset=utf-8",
        include_bytes!("static/uplot-1.6.32.min.css"),
    ),
    (
        "console.js",
        "text/javascript; charset=utf-8",
        include_bytes!("static/console.js"),
    ),
    (
        "console.css",
        "text/css; charset=utf-8",
        include_bytes!("static/console.css"),
    ),
];

pub fn routes() -> Router<Arc<Console>> {
    Router::new().route("/static/{file}", get(file))
}

async fn file(Path(name): Path<String>) -> Response {
    match FILES.iter().find(|(n, _, _)| *n == name) {
        Some((_, mime, bytes)) => (
            [
                (header::CONTENT_TYPE, *mime),
                (header::CACHE_CONTROL, "public, max-age=86400"),
            ],
            *bytes,
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "no such file\n").into_response(),
    }
}
