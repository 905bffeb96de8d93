//! `foqsctl dlq`: a topic's dead letters listed, requeued and purged.

use foqs::client::SyncClient;
use foqs::thrift_gen::*;
use serde_json::json;

use crate::cli::DlqCmd;
use crate::output::{describe, item_json, out, print_results};
use crate::Outcome;

pub fn run(c: &mut SyncClient, cmd: &DlqCmd, json: bool) -> Result<Outcome, String> {
    let e = |e: thrift::Error| describe(&e);
    match cmd {
        DlqCmd::List {
            ns,
            topic,
            limit,
            after,
        } => {
            let r = c
                .dlq_list(DlqListRequest {
                    forwarded_for: None,
                    ns: Some(ns.clone()),
                    topic: Some(topic.clone()),
                    limit: *limit,
                    after: after.clone(),
                    local_only: None,
                })
                .map_err(e)?;
            for d in r.items.unwrap_or_default() {
                let item = d.item.unwrap_or_default();
                if json {
                    let mut v = item_json(&item);
                    v["died_at_ms"] = json!(d.died_at_ms);
                    out(&v.to_string())?;
                } else {
                    out(&format!(
                        "{}\tdeliveries={}\tdied_at_ms={}\t{}",
                        item.id.as_deref().unwrap_or_default(),
                        item.delivery_count.unwrap_or(0),
                        d.died_at_ms.unwrap_or(0),
                        String::from_utf8_lossy(item.payload.as_deref().unwrap_or_default())
                    ))?;
                }
            }
            if let Some(next) = r.next_after {
                eprintln!("more: --after {next}");
            }
            Ok(Outcome::Done)
        }
        DlqCmd::Requeue { ids } => print_results(
            c.dlq_requeue(DlqRequeueRequest {
                ids: Some(ids.clone()),
                ..Default::default()
            })
            .map_err(e)?
            .results
            .unwrap_or_default(),
            json,
        ),
        DlqCmd::RequeueAll { ns, topic, max } => {
            let n = until_done(*max, |left| {
                c.dlq_requeue_all(DlqRequeueAllRequest {
                    forwarded_for: None,
                    ns: Some(ns.clone()),
                    topic: Some(topic.clone()),
                    max: left,
                    local_only: None,
                })
            })
            .map_err(e)?;
            counted("requeued", n, json)
        }
        DlqCmd::Purge { ns, topic } => {
            let n = until_done(None, |_| {
                c.dlq_purge(DlqPurgeRequest {
                    forwarded_for: None,
                    ns: Some(ns.clone()),
                    topic: Some(topic.clone()),
                    local_only: None,
                })
            })
            .map_err(e)?;
            counted("purged", n, json)
        }
    }
}

/// Says how many a bulk call did: `{"requeued": n}`, or `requeued n`.
fn counted(what: &str, n: i64, json: bool) -> Result<Outcome, String> {
    out(&if json {
        json!({ what: n }).to_string()
    } else {
        format!("{what} {n}")
    })?;
    Ok(Outcome::Done)
}

/// Calls a bulk dead-letter call until it says it is done (each call works within the
/// server's bound and answers `more` when some are left), or until `max` are counted;
/// `call` gets how many are still wanted. Returns the total.
fn until_done<E>(
    max: Option<i64>,
    mut call: impl FnMut(Option<i64>) -> Result<DlqCountResponse, E>,
) -> Result<i64, E> {
    let mut n = 0i64;
    loop {
        let r = call(max.map(|m| m - n))?;
        n += r.count.unwrap_or(0);
        if !r.more.unwrap_or(false) || max.is_some_and(|m| n >= m) {
            return Ok(n);
        }
    }
}
