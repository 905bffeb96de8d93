//! What foqsctl prints: items and per-item results as lines or JSON, and errors as
//! messages.

use std::io::Write;

use base64::Engine;
use foqs::thrift_gen::*;
use serde_json::{json, Value};

use crate::Outcome;

pub fn describe(e: &thrift::Error) -> String {
    match e {
        thrift::Error::User(u) => match u.downcast_ref::<FoqsError>() {
            Some(f) => format!(
                "{} (code {}{})",
                f.message.clone().unwrap_or_default(),
                f.code.map(|c| c.0).unwrap_or(0),
                if f.retryable == Some(true) {
                    ", retryable"
                } else {
                    ""
                }
            ),
            None => u.to_string(),
        },
        thrift::Error::Transport(t) => format!("transport: {}", t.message),
        thrift::Error::Protocol(p) => format!("protocol: {}", p.message),
        thrift::Error::Application(a) => format!("application: {}", a.message),
    }
}

pub fn out(line: &str) -> Result<(), String> {
    let mut o = std::io::stdout().lock();
    writeln!(o, "{line}").map_err(|e| e.to_string())
}

pub fn item_json(i: &Item) -> Value {
    let payload = i.payload.clone().unwrap_or_default();
    let metadata = i.metadata.clone().unwrap_or_default();
    let b64 = base64::engine::general_purpose::STANDARD;
    json!({
        "id": i.id, "ns": i.ns, "topic": i.topic, "priority": i.priority,
        "payload": String::from_utf8(payload.clone()).ok(),
        "payload_base64": b64.encode(&payload),
        "metadata": String::from_utf8(metadata.clone()).ok(),
        "metadata_base64": b64.encode(&metadata),
        "deliver_after_ms": i.deliver_after_ms, "enqueued_at_ms": i.enqueued_at_ms,
        "delivery_count": i.delivery_count, "lease_expires_ms": i.lease_expires_ms,
        "lease_id": i.lease_id,
        "policy": match i.policy { Some(DeliveryPolicy::AT_MOST_ONCE) => "at-most-once", _ => "at-least-once" },
    })
}

pub fn print_items(items: &[Item], json: bool, raw: bool) -> Result<Outcome, String> {
    if items.is_empty() {
        return Ok(Outcome::Nothing);
    }
    for i in items {
        if raw {
            std::io::stdout()
                .lock()
                .write_all(i.payload.as_deref().unwrap_or_default())
                .map_err(|e| e.to_string())?;
        } else if json {
            out(&item_json(i).to_string())?;
        } else {
            let payload = i.payload.as_deref().unwrap_or_default();
            out(&format!(
                "{}\tpriority={}\tdeliveries={}\t{}",
                i.id.as_deref().unwrap_or_default(),
                i.priority.unwrap_or(0),
                i.delivery_count.unwrap_or(0),
                String::from_utf8_lossy(payload)
            ))?;
        }
    }
    Ok(Outcome::Done)
}

/// Prints per-item results; any failed item makes the command fail.
pub fn print_results(results: Vec<ItemResult>, json: bool) -> Result<Outcome, String> {
    let mut failed = 0;
    for r in results {
        let id = r.id.unwrap_or_default();
        match r.error {
            None if json => out(&json!({"id": id, "ok": true}).to_string())?,
            None => out(&format!("{id}\tok"))?,
            Some(e) => {
                failed += 1;
                let (code, msg) = (
                    e.code.map(|c| c.0).unwrap_or(0),
                    e.message.unwrap_or_default(),
                );
                if json {
                    out(&json!({"id": id, "ok": false, "code": code, "message": msg}).to_string())?;
                }
                eprintln!("foqsctl: {id}: {msg} (code {code})");
            }
        }
    }
    if failed > 0 {
        return Err(format!("{failed} item(s) failed"));
    }
    Ok(Outcome::Done)
}
