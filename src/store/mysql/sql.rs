//! The SQL text the MySQL store sends for writes whose shape varies with their input:
//! multi-row INSERTs, grouped state changes, id lists. Built as text (ids are integers,
//! bytes are hex literals), so they need no prepare round trip and no escaping.

use mysql_async::prelude::*;
use mysql_async::{Params, Value};

use super::INSERT_COLUMNS;
use crate::model::NewItem;
use crate::store::{Change, StoreResult};

/// `1,2,3` for an `IN (...)` list; callers never pass an empty slice.
pub(super) fn key_list(keys: &[u64]) -> String {
    let mut s = String::with_capacity(keys.len() * 8);
    for (i, k) in keys.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&k.to_string());
    }
    s
}

/// Runs one statement: a prepared one when it has parameters (a blob), else in the text
/// protocol, which saves the prepare round trip for SQL that is different every time.
pub(super) async fn run<Q: Queryable>(q: &mut Q, sql: &str, params: Params) -> StoreResult<()> {
    match params {
        Params::Empty => q.query_drop(sql).await?,
        p => q.exec_drop(sql, p).await?,
    }
    Ok(())
}

/// Appends `bytes` as a hex literal (`X'...'`): binary-safe in the text protocol, with
/// nothing to escape.
pub(super) fn push_hex(sql: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    sql.push_str("X'");
    for b in bytes {
        sql.push(HEX[(b >> 4) as usize] as char);
        sql.push(HEX[(b & 15) as usize] as char);
    }
    sql.push('\'');
}

/// One multi-row INSERT in the text protocol: a prepared statement would cost an extra
/// round trip per batch, since batch sizes vary and each size is different SQL.
pub(super) fn insert_sql(rows: &[(u64, NewItem)]) -> String {
    use std::fmt::Write;
    let bytes: usize = rows
        .iter()
        .map(|(_, it)| 2 * (it.payload.len() + it.metadata.len()) + 160)
        .sum();
    let mut sql = String::with_capacity(128 + bytes);
    sql.push_str("INSERT INTO items ");
    sql.push_str(INSERT_COLUMNS);
    sql.push_str(" VALUES ");
    for (i, (key, it)) in rows.iter().enumerate() {
        if i > 0 {
            sql.push(',');
        }
        let _ = write!(sql, "({key},");
        push_hex(&mut sql, it.ns.as_bytes());
        sql.push(',');
        push_hex(&mut sql, it.topic.as_bytes());
        let expires = it
            .expires_at_ms
            .map_or_else(|| "NULL".to_string(), |t| t.to_string());
        // Only a deferred item needs the due scan; a ready one is indexed on commit.
        let due_at = if it.deliver_after_ms > it.enqueued_at_ms {
            it.deliver_after_ms.to_string()
        } else {
            "NULL".to_string()
        };
        let _ = write!(
            sql,
            ",{},0,{},{due_at},{},{},{expires},{},{},",
            it.priority,
            it.deliver_after_ms,
            it.enqueued_at_ms,
            it.lease_ms,
            it.policy as i8,
            it.max_attempts
        );
        push_hex(&mut sql, &it.payload);
        sql.push(',');
        push_hex(&mut sql, &it.metadata);
        sql.push(',');
        match &it.dedup_key {
            Some(k) => push_hex(&mut sql, k.as_bytes()),
            None => sql.push_str("NULL"),
        }
        sql.push(')');
    }
    sql
}

/// The fewest statements that apply `changes`: one per kind of change (and per new
/// `deliver_after_ms`), except that a change carrying metadata updates its row alone.
pub(super) fn apply_statements(changes: &[Change]) -> Vec<(String, Params)> {
    const READY: &str = "UPDATE items SET state = 0, lease_token = 0";
    let mut deletes = Vec::new();
    let mut dead: std::collections::BTreeMap<i64, Vec<u64>> = std::collections::BTreeMap::new();
    let mut revived = Vec::new();
    let mut keep_place = Vec::new();
    let mut at: std::collections::BTreeMap<i64, Vec<u64>> = std::collections::BTreeMap::new();
    let mut released: std::collections::BTreeMap<i64, Vec<u64>> = std::collections::BTreeMap::new();
    let mut extended: std::collections::BTreeMap<i64, Vec<u64>> = std::collections::BTreeMap::new();
    let mut out: Vec<(String, Params)> = Vec::new();
    for c in changes {
        match c {
            Change::Delete { key } => deletes.push(*key),
            Change::Dead { key, at_ms } => dead.entry(*at_ms).or_default().push(*key),
            Change::Revive { key } => revived.push(*key),
            Change::Release { key, token } => released.entry(*token).or_default().push(*key),
            Change::Extend {
                key,
                lease_expires_ms,
            } => extended.entry(*lease_expires_ms).or_default().push(*key),
            Change::Ready {
                key,
                deliver_after_ms: None,
                metadata: None,
            } => keep_place.push(*key),
            Change::Ready {
                key,
                deliver_after_ms: Some(t),
                metadata: None,
            } => at.entry(*t).or_default().push(*key),
            Change::Ready {
                key,
                deliver_after_ms,
                metadata: Some(m),
            } => {
                let (set_time, mut params): (&str, Vec<Value>) = match deliver_after_ms {
                    Some(t) => (
                        ", deliver_after_ms = ?, due_at_ms = ?",
                        vec![(*t).into(), (*t).into()],
                    ),
                    None => ("", vec![]),
                };
                params.push(m.as_slice().into());
                params.push((*key).into());
                out.push((
                    format!("{READY}{set_time}, metadata = ? WHERE id = ? AND state = 1"),
                    Params::Positional(params),
                ));
            }
        }
    }
    if !keep_place.is_empty() {
        out.push((
            format!(
                "{READY} WHERE id IN ({}) AND state = 1",
                key_list(&keep_place)
            ),
            Params::Empty,
        ));
    }
    for (t, keys) in at {
        out.push((
            format!(
                "{READY}, deliver_after_ms = {t}, due_at_ms = {t} WHERE id IN ({}) AND state = 1",
                key_list(&keys)
            ),
            Params::Empty,
        ));
    }
    for (until, keys) in extended {
        out.push((
            format!(
                "UPDATE items SET lease_expires_ms = {until} WHERE id IN ({}) AND state = 1",
                key_list(&keys)
            ),
            Params::Empty,
        ));
    }
    for (token, keys) in released {
        out.push((
            format!(
                "{READY}, delivery_count = delivery_count - 1 WHERE id IN ({}) AND state = 1 AND lease_token = {token}",
                key_list(&keys)
            ),
            Params::Empty,
        ));
    }
    for (at_ms, keys) in dead {
        out.push((
            format!(
                "UPDATE items SET state = 2, lease_token = 0, died_at_ms = {at_ms} WHERE id IN ({}) AND state = 1",
                key_list(&keys)
            ),
            Params::Empty,
        ));
    }
    if !revived.is_empty() {
        out.push((
            format!(
                "UPDATE items SET state = 0, delivery_count = 0, died_at_ms = NULL WHERE id IN ({}) AND state = 2",
                key_list(&revived)
            ),
            Params::Empty,
        ));
    }
    if !deletes.is_empty() {
        out.push((
            format!("DELETE FROM items WHERE id IN ({})", key_list(&deletes)),
            Params::Empty,
        ));
    }
    out
}
