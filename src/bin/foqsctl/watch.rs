//! `foqsctl watch`: a namespace's topics, refreshed every `--interval`: ready, deferred,
//! leased and dead items, the oldest ready item's age, and enqueue and delivery rates
//! (from the topics' totals between two refreshes). Through any host: the active topics
//! and their stats are the tier's (foqsd asks its peers). On a terminal the table is
//! redrawn in place, like `top`; with `--json`, one JSON object per refresh; otherwise one
//! table per refresh, a blank line between.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use foqs::client::SyncClient;
use foqs::thrift_gen::*;
use serde_json::{json, Value};

use crate::output::{describe, out};
use crate::Outcome;

pub struct WatchArgs {
    pub ns: String,
    pub topic: Option<String>,
    pub interval_ms: u64,
    /// Topics shown at most (the most ready first).
    pub limit: usize,
    /// Refreshes before it ends (`None`: until interrupted).
    pub count: Option<u64>,
}

/// The topics' names to look at: the one asked for, or the namespace's active topics.
fn topics(c: &mut SyncClient, a: &WatchArgs) -> Result<Vec<String>, String> {
    if let Some(t) = &a.topic {
        return Ok(vec![t.clone()]);
    }
    let mut found: Vec<(i64, String)> = Vec::new();
    let mut after = None;
    // Every page (each holds up to 1000): the busiest are kept, whatever their names.
    for _ in 0..100 {
        let r = c
            .get_active_topics(GetActiveTopicsRequest {
                forwarded_for: None,
                ns: Some(a.ns.clone()),
                limit: Some(1000),
                after: after.clone(),
                local_only: None,
            })
            .map_err(|e| describe(&e))?;
        for t in r.topics.unwrap_or_default() {
            let busy = t.ready.unwrap_or(0) + t.leased.unwrap_or(0) + t.deferred.unwrap_or(0);
            found.push((busy, t.topic.unwrap_or_default()));
        }
        after = r.next_after;
        if after.is_none() {
            break;
        }
    }
    found.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    found.truncate(a.limit);
    Ok(found.into_iter().map(|(_, t)| t).collect())
}

pub fn watch(c: &mut SyncClient, a: &WatchArgs, as_json: bool) -> Result<Outcome, String> {
    // SAFETY: isatty(2) on our own standard output.
    let tty = unsafe { libc::isatty(1) } == 1;
    let mut before: HashMap<String, (Instant, i64, i64)> = HashMap::new();
    let mut n = 0u64;
    loop {
        let names = topics(c, a)?;
        let now = Instant::now();
        let mut rows = Vec::with_capacity(names.len());
        for name in names {
            let s = c
                .topic_stats(TopicStatsRequest {
                    forwarded_for: None,
                    ns: Some(a.ns.clone()),
                    topic: Some(name.clone()),
                    local_only: None,
                })
                .map_err(|e| describe(&e))?;
            let (enq, del) = (s.enqueued.unwrap_or(0), s.delivered.unwrap_or(0));
            let rate = |then: Instant, was: i64, is: i64| {
                let secs = now.duration_since(then).as_secs_f64().max(1e-3);
                ((is - was).max(0) as f64 / secs * 10.0).round() / 10.0
            };
            let (enq_rate, del_rate) = match before.get(&name) {
                Some(&(then, e, d)) => (Some(rate(then, e, enq)), Some(rate(then, d, del))),
                None => (None, None),
            };
            before.insert(name.clone(), (now, enq, del));
            rows.push(json!({
                "topic": name,
                "ready": s.ready.unwrap_or(0), "deferred": s.deferred.unwrap_or(0),
                "leased": s.leased.unwrap_or(0), "dead": s.dead.unwrap_or(0),
                "oldest_ready_age_ms": s.oldest_ready_age_ms.unwrap_or(0),
                "enqueued_per_s": enq_rate, "delivered_per_s": del_rate,
            }));
        }
        if as_json {
            let at_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            out(&json!({"at_ms": at_ms, "ns": a.ns, "topics": rows}).to_string())?;
        } else {
            let table = render(&a.ns, &rows);
            if tty {
                // Home, clear, then the table: redrawn in place.
                out(&format!("\x1b[H\x1b[2J{table}"))?;
            } else {
                if n > 0 {
                    out("")?;
                }
                out(&table)?;
            }
        }
        n += 1;
        if a.count.is_some_and(|c| n >= c) {
            return Ok(Outcome::Done);
        }
        std::thread::sleep(Duration::from_millis(a.interval_ms));
    }
}

fn render(ns: &str, rows: &[Value]) -> String {
    let mut s = format!(
        "namespace {ns}: {} topic(s)\n{:<32} {:>9} {:>9} {:>9} {:>9} {:>12} {:>10} {:>10}",
        rows.len(),
        "TOPIC",
        "READY",
        "DEFERRED",
        "LEASED",
        "DEAD",
        "OLDEST_MS",
        "ENQ/S",
        "DEL/S"
    );
    for r in rows {
        let rate = |k: &str| r[k].as_f64().map_or("-".to_string(), |v| format!("{v:.1}"));
        s.push_str(&format!(
            "\n{:<32} {:>9} {:>9} {:>9} {:>9} {:>12} {:>10} {:>10}",
            r["topic"].as_str().unwrap_or(""),
            r["ready"].to_string(),
            r["deferred"].to_string(),
            r["leased"].to_string(),
            r["dead"].to_string(),
            r["oldest_ready_age_ms"].to_string(),
            rate("enqueued_per_s"),
            rate("delivered_per_s"),
        ));
    }
    s
}
