//! The web console (`[console] listen`): server-rendered pages for operators (overview,
//! namespaces and topics, a topic's next items, dead letters, the cluster) and the JSON
//! API under `/api/v1/` they are built from. Everything is compiled into the binary: the
//! templates (maud, which escapes every value) and a few vendored static files (htmx,
//! uPlot; `static/VENDORED.md`).
//!
//! Security, on every request: basic auth when `[[console.users]]` are listed (a
//! read-only role may look but not change); every state-changing request is a POST, and
//! a POST is refused unless it comes from the console's own origin (`Origin` matches
//! `Host`; form posts must carry an `Origin`, JSON ones need `application/json`, which no
//! other site can send without a CORS grant, never given); a Content-Security-Policy
//! without inline scripts or styles; no framing.

mod actions;
mod api;
mod assets;
mod auth;
mod data;
mod pages;
mod series;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;

pub use auth::{hash_password, Users, Verdict};
pub use series::{run_sampler, Series};

use crate::config::ConsoleConfig;
use crate::core::{Caller, Host};

/// The content security policy of every response: scripts, styles and fetches from the
/// console itself only; no inline script or style; no plugins; never framed.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                       connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

/// What every console handler works with.
pub struct Console {
    pub(crate) host: Arc<Host>,
    pub(crate) caller: Caller,
    pub(crate) users: Users,
    pub(crate) series: Arc<Series>,
    pub(crate) refresh_ms: u64,
    pub(crate) topic_rates: data::TopicRates,
}

impl Console {
    pub fn new(host: Arc<Host>, cfg: &ConsoleConfig, series: Arc<Series>) -> Console {
        Console {
            host,
            caller: cfg
                .identity
                .as_deref()
                .map_or_else(Caller::anonymous, Caller::new),
            users: Users::new(cfg.users.clone()),
            series,
            refresh_ms: cfg.refresh_ms(),
            topic_rates: Default::default(),
        }
    }
}

/// The role a request was let in with, for handlers that change state.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Role(pub Verdict);

pub fn router(console: Arc<Console>) -> Router {
    Router::new()
        .merge(pages::routes())
        .nest("/api/v1", api::routes())
        .merge(assets::routes())
        .layer(middleware::from_fn_with_state(console.clone(), guard))
        .with_state(console)
}

/// Serves until `shutdown` turns true.
pub async fn serve_console(
    listener: TcpListener,
    console: Arc<Console>,
    mut shutdown: watch::Receiver<bool>,
) {
    let stop = async move {
        let _ = shutdown.changed().await;
    };
    if let Err(e) = axum::serve(listener, router(console))
        .with_graceful_shutdown(stop)
        .await
    {
        tracing::warn!(error = %e, "console listener failed");
    }
}

fn security_headers(r: &mut Response) {
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
}

fn refuse(status: StatusCode, why: &str) -> Response {
    let mut r = (status, format!("{why}\n")).into_response();
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"foqs console\", charset=\"UTF-8\""),
        );
    }
    security_headers(&mut r);
    r
}

/// Whether a POST may change state: it must come from the console's own origin.
pub(crate) fn same_origin(headers: &HeaderMap) -> Result<(), &'static str> {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .ok_or("no Host header")?;
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|c| c.to_str().ok())
        .is_some_and(|c| c.starts_with("application/json"));
    match headers.get(header::ORIGIN).map(|o| o.to_str()) {
        Some(Ok(origin)) => {
            let rest = origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"))
                .ok_or("the Origin is not this console")?;
            if rest.eq_ignore_ascii_case(host) {
                Ok(())
            } else {
                Err("the Origin is not this console")
            }
        }
        Some(Err(_)) => Err("the Origin is not this console"),
        // Browsers send an Origin with every POST; a client that sends none (a script)
        // must send JSON, which a page of another site cannot make a browser send.
        None if json => Ok(()),
        None => Err("a form POST without an Origin header"),
    }
}

async fn guard(State(c): State<Arc<Console>>, mut req: Request, next: Next) -> Response {
    let auth = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let verdict = c.users.verify(auth);
    if verdict == Verdict::Refused {
        return refuse(StatusCode::UNAUTHORIZED, "log in to the foqs console");
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        if req.method() != Method::POST {
            return refuse(StatusCode::METHOD_NOT_ALLOWED, "GET or POST only");
        }
        if let Err(why) = same_origin(req.headers()) {
            return refuse(StatusCode::FORBIDDEN, &format!("refused: {why}"));
        }
        if !verdict.may_change() {
            return refuse(
                StatusCode::FORBIDDEN,
                "refused: this user's role is read-only",
            );
        }
    }
    req.extensions_mut().insert(Role(verdict));
    let mut r = next.run(req).await;
    security_headers(&mut r);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn posts_from_another_origin_or_forms_without_one_are_refused() {
        let ok = headers(&[
            ("host", "127.0.0.1:9190"),
            ("origin", "http://127.0.0.1:9190"),
        ]);
        assert!(same_origin(&ok).is_ok());
        let other = headers(&[
            ("host", "127.0.0.1:9190"),
            ("origin", "http://evil.example"),
        ]);
        assert!(same_origin(&other).is_err());
        let null = headers(&[("host", "127.0.0.1:9190"), ("origin", "null")]);
        assert!(same_origin(&null).is_err());
        let form = headers(&[
            ("host", "127.0.0.1:9190"),
            ("content-type", "application/x-www-form-urlencoded"),
        ]);
        assert!(same_origin(&form).is_err());
        let script = headers(&[
            ("host", "127.0.0.1:9190"),
            ("content-type", "application/json"),
        ]);
        assert!(same_origin(&script).is_ok());
    }
}
