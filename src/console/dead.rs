//! The console's dead-letter pages: a topic's dead items page by page, and the forms that
//! requeue one, requeue all, or purge them (see `pages.rs` for how pages and forms work).

use std::sync::Arc;

use axum::extract::{Extension, Form, Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use maud::html;
use serde::Deserialize;

use super::data::DlqPage;
use super::pages::{back_to, enc, failed_page, items_table, layout, msg_box, topic_url, Done, C};
use super::{Console, Role};

pub fn routes() -> Router<Arc<Console>> {
    Router::new()
        .route("/ns/{ns}/t/{topic}/dlq", get(dlq))
        .route("/ns/{ns}/t/{topic}/dlq/requeue", post(requeue))
        .route("/ns/{ns}/t/{topic}/dlq/requeue-all", post(requeue_all))
        .route("/ns/{ns}/t/{topic}/dlq/purge", post(purge))
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct DlqQuery {
    after: Option<String>,
    /// Dead items per page (default 100, at most 1,000).
    limit: Option<i32>,
}

async fn dlq(
    State(c): C,
    Extension(role): Extension<Role>,
    Path((ns, topic)): Path<(String, String)>,
    Query(q): Query<DlqQuery>,
    Query(done): Query<Done>,
) -> Response {
    let page: DlqPage = match c.dlq(&ns, &topic, q.after.clone(), q.limit).await {
        Ok(p) => p,
        Err(e) => return failed_page(&c, role, "Dead letters", &e),
    };
    let url = topic_url(&ns, &topic);
    let body = html! {
        p.muted { a href=(format!("/ns/{}", enc(&ns))) { (ns) } " / " a href=(url) { (topic) } " / dead letters" }
        h1 { "Dead letters of " (topic) }
        (msg_box(&done))
        p #dead-count { (page.dead) " dead items." }
        @if page.items.is_empty() { p.muted #none { "No dead letters on this page." } }
        @else { (items_table("dead", &page.items, Some((&ns, &topic)))) }
        div.pager {
            @if q.after.is_some() { a #first href=(format!("{url}/dlq")) { "← first page" } }
            @if let Some(n) = &page.next {
                a #next href=(format!("{url}/dlq?after={}{}", enc(n), q.limit.map(|l| format!("&limit={l}")).unwrap_or_default())) { "next →" }
            }
        }
        @if page.dead > 0 {
            form.box #requeue-all method="post" action=(format!("{url}/dlq/requeue-all")) {
                "Make every dead item of this topic ready again. "
                button type="submit" { "Requeue all" }
            }
            form.box #purge method="post" action=(format!("{url}/dlq/purge")) {
                "Delete every dead item of this topic, for good. Type the topic's name to confirm: "
                input type="text" name="confirm" autocomplete="off";
                " "
                button.danger type="submit" { "Purge" }
            }
        }
    };
    layout(&c, role, &format!("Dead letters of {topic}"), body).into_response()
}

#[derive(Debug, Deserialize)]
struct IdForm {
    id: String,
}

async fn requeue(
    State(c): C,
    Extension(role): Extension<Role>,
    Path((ns, topic)): Path<(String, String)>,
    Form(f): Form<IdForm>,
) -> Response {
    match c.dlq_requeue(std::slice::from_ref(&f.id)).await {
        Ok(failed) if failed.is_empty() => back_to(
            format!("{}/dlq", topic_url(&ns, &topic)),
            &format!("done=requeued&id={}", enc(&f.id)),
        ),
        Ok(mut failed) => {
            let (_, e) = failed.remove(0);
            failed_page(&c, role, "Not requeued", &e)
        }
        Err(e) => failed_page(&c, role, "Not requeued", &e),
    }
}

async fn requeue_all(
    State(c): C,
    Extension(role): Extension<Role>,
    Path((ns, topic)): Path<(String, String)>,
) -> Response {
    match c.dlq_requeue_all(&ns, &topic).await {
        Ok(p) => back_to(
            format!("{}/dlq", topic_url(&ns, &topic)),
            &format!("done=requeued_all&n={}&more={}", p.count, p.more),
        ),
        Err(e) => failed_page(&c, role, "Not requeued", &e),
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PurgeForm {
    confirm: String,
}

async fn purge(
    State(c): C,
    Extension(role): Extension<Role>,
    Path((ns, topic)): Path<(String, String)>,
    Form(f): Form<PurgeForm>,
) -> Response {
    match c.dlq_purge(&ns, &topic, &f.confirm).await {
        Ok(p) => back_to(
            format!("{}/dlq", topic_url(&ns, &topic)),
            &format!("done=purged&n={}&more={}", p.count, p.more),
        ),
        Err(e) => failed_page(&c, role, "Not purged", &e),
    }
}
