//! The statements that apply a turn's [`Change`]s (items made ready again or dead, revived,
//! deleted, their leases extended), grouped so that one statement serves every change of a
//! kind and time.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::*;

/// Rows still on the lease each names: `(key, lease token)` pairs, as a condition that
/// both dialects read with the primary key (a `CASE` rather than row values, which MySQL
/// and SQLite spell differently in a list).
fn on_lease(rows: &[(u64, i64)]) -> String {
    let keys: Vec<u64> = rows.iter().map(|(k, _)| *k).collect();
    let cases: String = rows
        .iter()
        .map(|(k, t)| format!(" WHEN {k} THEN {t}"))
        .collect();
    format!(
        "id IN ({}) AND state = 1 AND lease_token = CASE id{cases} END",
        key_list(&keys)
    )
}

/// The fewest statements that apply `changes` at `now`: one per kind of change (and per
/// new time), except that a change carrying metadata updates its row alone.
pub fn apply_statements(dialect: Dialect, changes: &[Change], now: i64) -> Vec<Statement> {
    // A consumer's nack or dead-lettering also records what settled the lease: the lease
    // itself, or the nack's token (assigned first: MySQL assigns left to right, SQLite
    // from the old row, so both read the lease before it is cleared).
    let set_settled = |by: Settle| match by {
        Settle::Not => "UPDATE items SET ".to_string(),
        Settle::Lease => "UPDATE items SET settled_token = lease_token, ".to_string(),
        Settle::Token(t) => format!("UPDATE items SET settled_token = {t}, "),
    };
    let ready = |by: Settle| format!("{}state = 0, lease_token = 0", set_settled(by));
    const READY: &str = "UPDATE items SET state = 0, lease_token = 0";
    let ttl = ttl_timer(dialect, now);
    let mut deletes = Vec::new();
    let mut dead: BTreeMap<(i64, Settle), Vec<(u64, i64)>> = BTreeMap::new();
    let mut revived: BTreeMap<Option<i64>, Vec<u64>> = BTreeMap::new();
    let mut keep_place: BTreeMap<Settle, Vec<(u64, i64)>> = BTreeMap::new();
    let mut at: BTreeMap<(i64, Settle), Vec<(u64, i64)>> = BTreeMap::new();
    let mut released: BTreeMap<i64, Vec<u64>> = BTreeMap::new();
    let mut extended: BTreeMap<i64, Vec<(u64, i64)>> = BTreeMap::new();
    let mut timers: BTreeMap<Option<i64>, Vec<(u64, Option<i64>)>> = BTreeMap::new();
    let mut out: Vec<Statement> = Vec::new();
    // A nack to `t`: deferred until then, or ready at once at `t`.
    let ready_at = |t: i64, by: Settle| {
        let timer = if t > now {
            timer_at(&t.to_string(), now)
        } else {
            ttl.clone()
        };
        format!(
            "{}, deliver_after_ms = {t}, next_event_ms = {timer}",
            ready(by)
        )
    };
    for c in changes {
        match c {
            Change::Delete { key } => deletes.push(*key),
            Change::Dead {
                key,
                lease,
                at_ms,
                settle,
            } => dead
                .entry((*at_ms, *settle))
                .or_default()
                .push((*key, *lease)),
            Change::Revive { key, token } => revived.entry(*token).or_default().push(*key),
            Change::Release { key, token } => released.entry(*token).or_default().push(*key),
            Change::Extend {
                key,
                lease,
                lease_expires_ms,
            } => extended
                .entry(*lease_expires_ms)
                .or_default()
                .push((*key, *lease)),
            Change::Timer {
                key,
                at_ms,
                seen_ms,
            } => timers.entry(*at_ms).or_default().push((*key, *seen_ms)),
            Change::Ready {
                key,
                lease,
                deliver_after_ms: None,
                metadata: None,
                settle,
            } => keep_place.entry(*settle).or_default().push((*key, *lease)),
            Change::Ready {
                key,
                lease,
                deliver_after_ms: Some(t),
                metadata: None,
                settle,
            } => at.entry((*t, *settle)).or_default().push((*key, *lease)),
            Change::Ready {
                key,
                lease,
                deliver_after_ms,
                metadata: Some(m),
                settle,
            } => {
                let set = match deliver_after_ms {
                    Some(t) => ready_at(*t, *settle),
                    None => format!("{}, next_event_ms = {ttl}", ready(*settle)),
                };
                let mut sql = format!("{set}, metadata = ");
                push_hex(&mut sql, m);
                let _ = write!(
                    sql,
                    " WHERE id = {key} AND state = 1 AND lease_token = {lease}"
                );
                out.push(sql);
            }
        }
    }
    let mut push = |sql: String| out.push(sql);
    for (by, keys) in keep_place {
        push(format!(
            "{}, next_event_ms = {ttl} WHERE {}",
            ready(by),
            on_lease(&keys)
        ));
    }
    for ((t, by), keys) in at {
        push(format!("{} WHERE {}", ready_at(t, by), on_lease(&keys)));
    }
    for (until, keys) in extended {
        push(format!(
            "UPDATE items SET lease_expires_ms = {until}, next_event_ms = {} WHERE {}",
            timer_at(&until.to_string(), now),
            on_lease(&keys)
        ));
    }
    for (token, keys) in released {
        push(format!(
            "{READY}, delivery_count = delivery_count - 1, next_event_ms = {ttl}
             WHERE id IN ({}) AND state = 1 AND lease_token = {token}",
            key_list(&keys)
        ));
    }
    for ((at_ms, by), keys) in dead {
        push(format!(
            "{}state = 2, lease_token = 0, died_at_ms = {at_ms}, next_event_ms = {ttl}
             WHERE {}",
            set_settled(by),
            on_lease(&keys)
        ));
    }
    for (token, keys) in revived {
        let settled = token.map_or(String::new(), |t| format!(", settled_token = {t}"));
        push(format!(
            "UPDATE items SET state = 0, delivery_count = 0, died_at_ms = NULL, next_event_ms = {ttl}{settled}
             WHERE id IN ({}) AND state = 2",
            key_list(&keys)
        ));
    }
    for (at_ms, rows) in timers {
        // Only where the timer is still what the scan read (see `Change::Timer`).
        let seen: Vec<(u64, i64)> = rows.iter().filter_map(|(k, s)| Some((*k, (*s)?))).collect();
        let any: Vec<u64> = rows
            .iter()
            .filter(|(_, s)| s.is_none())
            .map(|(k, _)| *k)
            .collect();
        if !seen.is_empty() {
            let keys: Vec<u64> = seen.iter().map(|(k, _)| *k).collect();
            let cases: String = seen
                .iter()
                .map(|(k, s)| format!(" WHEN {k} THEN {s}"))
                .collect();
            push(format!(
                "UPDATE items SET next_event_ms = {} WHERE id IN ({}) AND next_event_ms = CASE id{cases} END",
                timer_value(dialect, at_ms),
                key_list(&keys)
            ));
        }
        if !any.is_empty() {
            push(format!(
                "UPDATE items SET next_event_ms = {} WHERE id IN ({})",
                timer_value(dialect, at_ms),
                key_list(&any)
            ));
        }
    }
    if !deletes.is_empty() {
        push(format!(
            "DELETE FROM items WHERE id IN ({})",
            key_list(&deletes)
        ));
        push(format!(
            "DELETE FROM dedup WHERE id IN ({})",
            key_list(&deletes)
        ));
    }
    out
}
