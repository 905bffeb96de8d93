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
mod dead;
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
    /// `console.allowed_hosts`, lowercased.
    pub(crate) allowed_hosts: Vec<String>,
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
            allowed_hosts: cfg
                .allowed_hosts
                .iter()
                .map(|h| h.to_ascii_lowercase())
                .collect(),
        }
    }
}

/// The role a request was let in with, for handlers that change state.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Role(pub Verdict);

pub fn router(console: Arc<Console>) -> Router {
    Router::new()
        .merge(pages::routes())
        .merge(dead::routes())
        .nest("/api/v1", api::routes())
        .merge(assets::routes())
        .layer(middleware::from_fn_with_state(console.clone(), guard))
        .with_state(console)
}

/// Serves until `shutdown` turns true.
pub async fn serve_console(
    listener: TcpListener,
    console: Arc<Console>,
    limits: crate::server::HttpLimits,
    shutdown: watch::Receiver<bool>,
) {
    crate::server::serve_router(listener, router(console), "console", limits, shutdown).await
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

/// A refusal by the guard: JSON under `/api/`, text elsewhere.
fn refuse(api: bool, status: StatusCode, why: &str) -> Response {
    let mut r = if api {
        (
            status,
            axum::Json(serde_json::json!({"error": {
                "code": status.canonical_reason().unwrap_or("Error"),
                "message": why
            }})),
        )
            .into_response()
    } else {
        (status, format!("{why}\n")).into_response()
    };
    let h = r.headers_mut();
    if status == StatusCode::UNAUTHORIZED {
        h.insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"foqs console\", charset=\"UTF-8\""),
        );
    }
    if status == StatusCode::METHOD_NOT_ALLOWED {
        h.insert(header::ALLOW, HeaderValue::from_static("GET, HEAD, POST"));
    }
    security_headers(&mut r);
    r
}

/// Whether the console may answer a request naming `host` (its `Host` header): an IP
/// address or `localhost` (with any port), or a name in `console.allowed_hosts`. Any
/// other name may be one a web page re-pointed at this machine (DNS rebinding), and
/// its requests would pass for same-origin ones.
pub(crate) fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let host = host.to_ascii_lowercase();
    if allowed.contains(&host) {
        return true;
    }
    let name = match host.strip_prefix('[') {
        Some(v6) => {
            return v6
                .split(']')
                .next()
                .is_some_and(|a| a.parse::<std::net::Ipv6Addr>().is_ok())
        }
        None => host.rsplit_once(':').map_or(host.as_str(), |(n, _)| n),
    };
    name == "localhost"
        || name.parse::<std::net::Ipv4Addr>().is_ok()
        || allowed.iter().any(|a| a == name)
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
    let api = req.uri().path().starts_with("/api/");
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    if !host_allowed(host, &c.allowed_hosts) {
        return refuse(
            api,
            StatusCode::MISDIRECTED_REQUEST,
            "refused: this console is not reached by that host name (see console.allowed_hosts)",
        );
    }
    let auth = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let source = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip());
    let verdict = c.users.verify(auth, source).await;
    match verdict {
        Verdict::Refused => {
            return refuse(api, StatusCode::UNAUTHORIZED, "log in to the foqs console")
        }
        Verdict::Busy => {
            let mut r = refuse(
                api,
                StatusCode::SERVICE_UNAVAILABLE,
                "too many logins being checked at once: try again",
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return r;
        }
        Verdict::Open | Verdict::User(_) => {}
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        if req.method() != Method::POST {
            return refuse(api, StatusCode::METHOD_NOT_ALLOWED, "GET or POST only");
        }
        if let Err(why) = same_origin(req.headers()) {
            return refuse(api, StatusCode::FORBIDDEN, &format!("refused: {why}"));
        }
        if !verdict.may_change() {
            return refuse(
                api,
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

    #[test]
    fn only_addresses_localhost_and_listed_names_may_name_the_console() {
        let listed = vec!["queue.internal".to_string(), "ops.example:8443".to_string()];
        for ok in [
            "127.0.0.1:9190",
            "10.1.2.3",
            "[::1]:9190",
            "localhost:9190",
            "LOCALHOST",
            "queue.internal:9190",
            "ops.example:8443",
        ] {
            assert!(host_allowed(ok, &listed), "{ok}");
        }
        for refused in [
            "rebind.evil:9190",
            "",
            "ops.example:9190",
            "[nope]:1",
            "localhost.evil",
            "127.0.0.1.evil:80",
        ] {
            assert!(!host_allowed(refused, &listed), "{refused}");
        }
    }
}
