//! The console's HTML pages (maud: compiled templates that escape every value). Each page
//! renders a `data` struct; the part of a page that refreshes itself is `#live`, which
//! htmx reloads from the same URL (`hx-select`), so no page has a second renderer.
//! Forms post to the console and are answered with a redirect (303) back to the page with
//! a message, or with an error page.

use std::sync::Arc;

use axum::extract::{Extension, Form, Path, Query, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use maud::{html, Markup, DOCTYPE};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::Deserialize;

use super::assets;
use super::data::{ItemView, TopicList, TopicQuery, TopicSort, TopicView};
use super::{Console, Role};
use crate::error::{Error, ErrorCode};

pub(super) type C = State<Arc<Console>>;

pub fn routes() -> Router<Arc<Console>> {
    Router::new()
        .route("/", get(overview))
        .route("/namespaces", get(namespaces))
        .route("/ns/{ns}", get(topics))
        .route("/ns/{ns}/t/{topic}", get(topic))
        .route("/ns/{ns}/t/{topic}/enqueue", post(enqueue))
        .route("/cluster", get(cluster))
}

/// Characters kept as they are in a path segment; everything else is %-encoded.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

pub fn enc(s: &str) -> String {
    utf8_percent_encode(s, SEGMENT).to_string()
}

pub(super) fn topic_url(ns: &str, topic: &str) -> String {
    format!("/ns/{}/t/{}", enc(ns), enc(topic))
}

/// Unix milliseconds as UTC `YYYY-MM-DD HH:MM:SS.mmmZ`.
pub fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, sod) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:03}Z",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60,
        ms.rem_euclid(1000)
    )
}

/// A duration in ms, short: "850 ms", "12.3 s", "4 min 5 s", "2 h 3 min".
pub fn ago(ms: i64) -> String {
    match ms {
        i64::MIN..=999 => format!("{} ms", ms.max(0)),
        1_000..=59_999 => format!("{:.1} s", ms as f64 / 1000.0),
        60_000..=3_599_999 => format!("{} min {} s", ms / 60_000, ms % 60_000 / 1000),
        _ => format!("{} h {} min", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

fn rate(r: f64) -> String {
    if r >= 100.0 {
        format!("{r:.0}/s")
    } else {
        format!("{r:.1}/s")
    }
}

pub(super) fn layout(c: &Console, role: Role, title: &str, body: Markup) -> Html<String> {
    let v = env!("CARGO_PKG_VERSION");
    let who = match role.0 {
        super::Verdict::User(crate::config::ConsoleRole::ReadOnly) => "read-only",
        _ => "admin",
    };
    Html(
        html! {
            (DOCTYPE)
            html lang="en" {
                head {
                    meta charset="utf-8";
                    meta name="viewport" content="width=device-width, initial-scale=1";
                    // No indicator <style> injected, no eval: the CSP allows neither.
                    meta name="htmx-config" content=r#"{"includeIndicatorStyles":false,"allowEval":false,"allowScriptTags":false}"#;
                    title { (title) " · foqs" }
                    link rel="stylesheet" href=(format!("{}?v={v}", assets::UPLOT_CSS));
                    link rel="stylesheet" href=(format!("{}?v={v}", assets::CONSOLE_CSS));
                    script src=(assets::HTMX) defer {}
                    script src=(assets::UPLOT_JS) defer {}
                    script src=(format!("{}?v={v}", assets::CONSOLE_JS)) defer {}
                }
                body data-refresh-ms=(c.refresh_ms) {
                    header {
                        span.brand { "foqs" }
                        nav {
                            a href="/" { "Overview" }
                            a href="/namespaces" { "Namespaces" }
                            a href="/cluster" { "Cluster" }
                        }
                        span.spacer {}
                        span.muted { (c.host.host_id()) " · " (who) }
                        button #pause type="button" { "Pause refresh" }
                    }
                    main { (body) }
                }
            }
        }
        .into_string(),
    )
}

/// Shards as "0 serving 1 breaker_open", each coloured by its health.
fn shard_states(shards: &[super::data::ShardRow]) -> Markup {
    html! {
        @for s in shards {
            span class=(if s.healthy { "good" } else { "bad" }) { (s.shard) " " (s.state) }
            " "
        }
    }
}

/// A host's reachability cell.
fn reachable(yes: bool) -> Markup {
    html! {
        td class=(if yes { "good" } else { "bad" }) { (if yes { "reachable" } else { "unreachable" }) }
    }
}

pub(super) fn status_of(e: &Error) -> StatusCode {
    match e.code {
        ErrorCode::InvalidArgument | ErrorCode::PayloadTooLarge => StatusCode::BAD_REQUEST,
        ErrorCode::NotFound | ErrorCode::UnknownNamespace => StatusCode::NOT_FOUND,
        ErrorCode::PermissionDenied => StatusCode::FORBIDDEN,
        ErrorCode::RateLimited => StatusCode::TOO_MANY_REQUESTS,
        ErrorCode::Unavailable | ErrorCode::WrongHost => StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn error_page(c: &Console, role: Role, status: StatusCode, what: &str, why: &str) -> Response {
    let body = html! {
        h1 { (what) }
        div.msg.error #error { (why) }
        p { a href="/" { "Back to the overview" } }
    };
    (status, layout(c, role, what, body)).into_response()
}

pub(super) fn failed_page(c: &Console, role: Role, what: &str, e: &Error) -> Response {
    error_page(c, role, status_of(e), what, &e.message)
}

/// What a form did, as the redirect after it says (fixed texts with checked values, so a
/// crafted link cannot make the console say something of its own).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct Done {
    done: Option<String>,
    id: Option<String>,
    n: Option<String>,
    more: Option<String>,
}

impl Done {
    fn text(&self) -> Option<String> {
        let id = self
            .id
            .as_deref()
            .filter(|id| id.parse::<crate::model::ItemId>().is_ok());
        let n = self.n.as_deref().and_then(|n| n.parse::<i64>().ok());
        let more = |what: &str| {
            if self.more.as_deref() == Some("true") {
                format!("; more are left, {what} again")
            } else {
                String::new()
            }
        };
        Some(match (self.done.as_deref()?, id, n) {
            ("enqueued", Some(id), _) => format!("Enqueued {id}."),
            ("requeued", Some(id), _) => format!("Requeued {id}."),
            ("requeued_all", _, Some(n)) => format!("Requeued {n} dead items{}.", more("requeue")),
            ("purged", _, Some(n)) => format!("Purged {n} dead items{}.", more("purge")),
            _ => return None,
        })
    }
}

pub(super) fn msg_box(done: &Done) -> Markup {
    html! {
        @if let Some(m) = done.text() { div.msg #msg { (m) } }
    }
}

pub(super) fn back_to(url: String, query: &str) -> Response {
    Redirect::to(&format!("{url}?{query}")).into_response()
}

/// An HTML number field left empty posts `name=`: the default, not a refusal.
fn empty_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: std::str::FromStr + Default,
    T::Err: std::fmt::Display,
{
    let s = String::deserialize(d)?;
    let s = s.trim();
    if s.is_empty() {
        return Ok(T::default());
    }
    s.parse().map_err(serde::de::Error::custom)
}

async fn overview(State(c): C, Extension(role): Extension<Role>) -> Html<String> {
    let o = c.overview();
    let body = html! {
        h1 { "Overview" }
        div #live hx-get="/" hx-select="#live" hx-target="#live" hx-swap="outerHTML" hx-trigger="foqsrefresh from:body" {
            p.muted { "Host " (o.host_id) " (" (o.addr) "), tier " (o.tier) ", " (o.manager) " manager. Items on this host's shards:" }
            div.cards #items {
                @for (label, n) in [("ready", o.items.ready), ("deferred", o.items.deferred), ("leased", o.items.leased), ("dead", o.items.dead)] {
                    div.card data-state=(label) {
                        div.label { (label) }
                        div.value { (n) }
                    }
                }
                @for (label, r) in [("enqueued", o.rates.enqueued), ("delivered", o.rates.delivered), ("acked", o.rates.acked)] {
                    div.card data-rate=(label) {
                        div.label { (label) " (10 s)" }
                        div.value { (rate(r)) }
                    }
                }
            }
            h2 { "Shards" }
            table #shards {
                thead { tr { th { "shard" } th { "state" } th.num { "items" } } }
                tbody {
                    @for s in &o.shards {
                        tr {
                            td { (s.shard) }
                            td class=(if s.healthy { "good" } else { "bad" }) { (s.state) }
                            td.num { (s.items) }
                        }
                    }
                }
            }
            @if !o.peers.is_empty() {
                h2 { "Peers" }
                table #peers {
                    thead { tr { th { "host" } th { "address" } th { "tier" } th { "shards" } th { "state" } th.num { "spare" } } }
                    tbody {
                        @for p in &o.peers {
                            tr {
                                td { (p.host_id) }
                                td { (p.addr) }
                                td { (p.tier) }
                                td { (shard_states(&p.shards)) }
                                (reachable(p.reachable))
                                td.num { (p.spare) }
                            }
                        }
                    }
                }
            }
            p { a href="/namespaces" { (o.namespaces) " namespaces" } }
        }
        h2 { "Rates, last 10 minutes" }
        div #chart data-src="/api/v1/series" {}
    };
    layout(&c, role, "Overview", body)
}

async fn namespaces(State(c): C, Extension(role): Extension<Role>) -> Html<String> {
    let rows = c.namespaces();
    let body = html! {
        h1 { "Namespaces" }
        div #live hx-get="/namespaces" hx-select="#live" hx-target="#live" hx-swap="outerHTML" hx-trigger="foqsrefresh from:body" {
            @if rows.is_empty() { p.muted { "No items on this host." } }
            @else {
                table #namespaces {
                    thead { tr {
                        th { "namespace" } th { "tier" } th.num { "topics" } th.num { "ready" } th.num { "deferred" }
                        th.num { "leased" } th.num { "dead" } th.num { "oldest ready" }
                        th.num { "enqueued" } th.num { "delivered" } th.num { "acked" }
                    } }
                    tbody {
                        @for n in &rows {
                            tr data-ns=(n.row.ns) {
                                td { a href=(format!("/ns/{}", enc(&n.row.ns))) { (n.row.ns) } }
                                td { (n.row.tier) }
                                td.num { (n.row.topics) }
                                td.num { (n.row.ready) }
                                td.num { (n.row.deferred) }
                                td.num { (n.row.leased) }
                                td.num { (n.row.dead) }
                                td.num { @if n.row.ready > 0 { (ago(n.row.oldest_ready_age_ms)) } @else { "–" } }
                                td.num { (rate(n.rates.enqueued)) }
                                td.num { (rate(n.rates.delivered)) }
                                td.num { (rate(n.rates.acked)) }
                            }
                        }
                    }
                }
            }
        }
    };
    layout(&c, role, "Namespaces", body)
}

fn topics_url(l: &TopicList, offset: usize) -> String {
    format!(
        "/ns/{}?q={}&sort={}&offset={offset}&limit={}",
        enc(&l.ns),
        enc(&l.q),
        l.sort.name(),
        l.limit
    )
}

async fn topics(
    State(c): C,
    Extension(role): Extension<Role>,
    Path(ns): Path<String>,
    Query(q): Query<TopicQuery>,
) -> Response {
    let l = match c.topics(&ns, &q, true) {
        Ok(l) => l,
        Err(e) => return failed_page(&c, role, "Topics", &e),
    };
    let here = topics_url(&l, l.offset);
    let end = (l.offset + l.topics.len()).min(l.total);
    let body = html! {
        h1 { "Namespace " (l.ns) }
        form.box method="get" action=(format!("/ns/{}", enc(&l.ns))) {
            label { "Name contains " input type="search" name="q" value=(l.q); }
            label { "Sort by "
                select name="sort" {
                    @for s in TopicSort::ALL {
                        option value=(s.name()) selected[s == l.sort] { (s.name()) }
                    }
                }
            }
            input type="hidden" name="limit" value=(l.limit);
            button #filter type="submit" { "Show" }
        }
        div #live hx-get=(here) hx-select="#live" hx-target="#live" hx-swap="outerHTML" hx-trigger="foqsrefresh from:body" {
            div.pager {
                span #range { (if l.total == 0 { 0 } else { l.offset + 1 }) "–" (end) " of " (l.total) " topics" }
                @if l.offset > 0 {
                    a #prev href=(topics_url(&l, l.offset.saturating_sub(l.limit))) { "← previous" }
                }
                @if end < l.total {
                    a #next href=(topics_url(&l, end)) { "next →" }
                }
            }
            table #topics {
                thead { tr { th { "topic" } th.num { "ready" } th.num { "deferred" } th.num { "leased" } th.num { "dead" } th.num { "oldest ready" } } }
                tbody {
                    @for t in &l.topics {
                        tr {
                            td { a href=(topic_url(&l.ns, &t.topic)) { (t.topic) } }
                            td.num { (t.ready) }
                            td.num { (t.deferred) }
                            td.num { (t.leased) }
                            td.num { (t.dead) }
                            td.num { @if t.ready > 0 { (ago(t.oldest_ready_age_ms)) } @else { "–" } }
                        }
                    }
                }
            }
        }
    };
    layout(&c, role, &format!("Namespace {}", l.ns), body).into_response()
}

pub(super) fn items_table(id: &str, items: &[ItemView], dead: Option<(&str, &str)>) -> Markup {
    html! {
        table id=(id) {
            thead { tr {
                th { "id" } th.num { "priority" } th { "deliver after" } th.num { "deliveries" }
                @if dead.is_some() { th { "died at" } }
                th { "payload" } th { "metadata" }
                @if dead.is_some() { th {} }
            } }
            tbody {
                @for i in items {
                    tr data-id=(i.id) {
                        td { code { (i.id) } }
                        td.num { (i.priority) }
                        td { (utc(i.deliver_after_ms)) }
                        td.num { (i.deliveries) }
                        @if let Some(d) = i.died_at_ms { td { (utc(d)) } }
                        td { pre.preview { (i.payload_preview) } span.muted { (i.payload_bytes) " bytes" } }
                        td { pre.preview { (i.metadata_preview) } }
                        @if let Some((ns, topic)) = dead {
                            td {
                                form.inline method="post" action=(format!("{}/dlq/requeue", topic_url(ns, topic))) {
                                    input type="hidden" name="id" value=(i.id);
                                    button.requeue type="submit" { "Requeue" }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn topic_body(t: &TopicView, url: &str) -> Markup {
    html! {
        div #live hx-get=(url) hx-select="#live" hx-target="#live" hx-swap="outerHTML" hx-trigger="foqsrefresh from:body" {
            div.cards #items {
                @for (label, n) in [("ready", t.items.ready), ("deferred", t.items.deferred), ("leased", t.items.leased), ("dead", t.items.dead)] {
                    div.card data-state=(label) { div.label { (label) } div.value { (n) } }
                }
                div.card { div.label { "oldest ready" } div.value { @if t.items.ready > 0 { (ago(t.oldest_ready_age_ms)) } @else { "–" } } }
            }
            p.muted #totals {
                "Since counted: " (t.totals.enqueued) " enqueued, " (t.totals.delivered) " delivered, "
                (t.totals.acked) " acked, " (t.totals.nacked) " nacked, " (t.totals.expired) " leases expired."
                @if let Some(r) = t.rates {
                    " Now: " (rate(r.enqueued)) " enqueued, " (rate(r.delivered)) " delivered, " (rate(r.acked)) " acked."
                }
            }
            h2 { "Next items (a peek: nothing is leased)" }
            @if t.next.is_empty() { p.muted #none { "No ready items." } }
            @else { (items_table("next", &t.next, None)) }
        }
    }
}

async fn topic(
    State(c): C,
    Extension(role): Extension<Role>,
    Path((ns, topic)): Path<(String, String)>,
    Query(q): Query<Done>,
) -> Response {
    let t = match c.topic(&ns, &topic, None).await {
        Ok(t) => t,
        Err(e) => return failed_page(&c, role, "Topic", &e),
    };
    let url = topic_url(&ns, &topic);
    let body = html! {
        p.muted { a href=(format!("/ns/{}", enc(&ns))) { (ns) } " / topic" }
        h1 { (topic) }
        (msg_box(&q))
        (topic_body(&t, &url))
        p { a #dlq href=(format!("{url}/dlq")) { "Dead letters (" (t.items.dead) ")" } }
        h2 { "Enqueue a test item" }
        form.box #enqueue method="post" action=(format!("{url}/enqueue")) {
            label { "Payload " input type="text" name="payload" required maxlength="10240" size="40"; }
            label { "Priority " input type="number" name="priority" value="0"; }
            label { "Delay (ms) " input type="number" name="delay_ms" value="0" min="0"; }
            button type="submit" { "Enqueue" }
        }
    };
    layout(&c, role, &topic, body).into_response()
}

#[derive(Debug, Deserialize)]
struct EnqueueForm {
    payload: String,
    #[serde(default, deserialize_with = "empty_as_default")]
    priority: i32,
    #[serde(default, deserialize_with = "empty_as_default")]
    delay_ms: i64,
}

async fn enqueue(
    State(c): C,
    Extension(role): Extension<Role>,
    Path((ns, topic)): Path<(String, String)>,
    Form(f): Form<EnqueueForm>,
) -> Response {
    match c
        .enqueue_test(&ns, &topic, f.payload.into_bytes(), f.priority, f.delay_ms)
        .await
    {
        Ok(id) => back_to(
            topic_url(&ns, &topic),
            &format!("done=enqueued&id={}", enc(&id)),
        ),
        Err(e) => failed_page(&c, role, "Not enqueued", &e),
    }
}

async fn cluster(State(c): C, Extension(role): Extension<Role>) -> Html<String> {
    let p = c.cluster();
    let body = html! {
        h1 { "Cluster" }
        div #live hx-get="/cluster" hx-select="#live" hx-target="#live" hx-swap="outerHTML" hx-trigger="foqsrefresh from:body" {
            p.muted { "As host " (p.host_id) " sees it (" (p.manager) " manager)." }
            h2 { "Tiers" }
            table #tiers {
                thead { tr { th { "tier" } th { "hosts" } } }
                tbody { @for (t, hosts) in &p.tiers { tr { td { (t) } td { (hosts.join(", ")) } } } }
            }
            h2 { "Hosts" }
            table #hosts {
                thead { tr { th { "host" } th { "address" } th { "tier" } th { "region" } th { "shards" } th { "state" } } }
                tbody {
                    @for h in &p.hosts {
                        tr {
                            td { (h.host_id) @if h.this_host { " (this host)" } }
                            td { (h.addr) }
                            td { (h.tier) }
                            td { (h.region) }
                            td { (shard_states(&h.shards)) }
                            @match h.reachable {
                                Some(yes) => (reachable(yes)),
                                None => td { "not polled" },
                            }
                        }
                    }
                }
            }
            h2 { "Shards" }
            table #cluster-shards {
                thead { tr { th { "shard" } th { "owner" } th { "primary" } th { "state" } th.num { "generation" } } }
                tbody {
                    @for s in &p.shards {
                        tr {
                            td { (s.shard) }
                            td { @if let Some(o) = &s.owner { (o) } @else { span.bad { "none (moving)" } } }
                            td { @if let Some(a) = &s.primary { (a) } @else { span.muted { "not replicated" } } }
                            td { @if let Some(st) = &s.primary_state { (st) } }
                            td.num { @if let Some(g) = s.generation { (g) } }
                        }
                    }
                }
            }
        }
    };
    layout(&c, role, "Cluster", body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_names_are_shown_as_operators_read_them() {
        assert_eq!(utc(0), "1970-01-01 00:00:00.000Z");
        assert_eq!(utc(1_764_624_601_123), "2025-12-01 21:30:01.123Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00.000Z");
        assert_eq!(ago(850), "850 ms");
        assert_eq!(ago(12_345), "12.3 s");
        assert_eq!(ago(245_000), "4 min 5 s");
        assert_eq!(enc("a/b c?<"), "a%2Fb%20c%3F%3C");
    }
}
