//! Rows of the SQLite shard as the store's types, and running prepared statement lists.

use std::sync::{Arc, Mutex};

use rusqlite::{Connection, Row};

use super::conn::store_error;
use crate::model::{Item, ItemId, ItemState, Policy, ShardId};
use crate::store::sql::Statement;
use crate::store::topics::TopicIds;
use crate::store::{ItemMeta, StoreResult};

pub(super) const ITEM_COLUMNS: &str = "id, tid, priority, payload, metadata, deliver_after_ms, enqueued_at_ms, delivery_count, lease_expires_ms, policy, expires_at_ms, lease_token, lease_ms";
pub(super) const META_COLUMNS: &str = "id, tid, priority, deliver_after_ms, state, delivery_count, max_attempts, policy, lease_expires_ms, expires_at_ms, lease_token, next_event_ms, has_dedup, settled_token";
/// What the row readers need, owned, so that a job can take it to the shard's thread.
#[derive(Clone)]
pub(super) struct Rows {
    pub(super) shard: ShardId,
    pub(super) topics: Arc<Mutex<TopicIds>>,
}

impl Rows {
    fn names(&self, tid: u32) -> rusqlite::Result<(String, String)> {
        self.topics.lock().expect("topics").name(tid).map_err(|e| {
            rusqlite::Error::FromSqlConversionFailure(1, rusqlite::types::Type::Integer, e.into())
        })
    }

    pub(super) fn item(&self, r: &Row) -> rusqlite::Result<Item> {
        let (ns, topic) = self.names(r.get(1)?)?;
        Ok(Item {
            id: ItemId {
                shard: self.shard,
                key: r.get::<_, i64>(0)? as u64,
            },
            ns,
            topic,
            priority: r.get(2)?,
            payload: r.get(3)?,
            metadata: r.get(4)?,
            deliver_after_ms: r.get(5)?,
            enqueued_at_ms: r.get(6)?,
            delivery_count: r.get(7)?,
            lease_expires_ms: r.get(8)?,
            policy: policy(r.get(9)?)?,
            expires_at_ms: r.get(10)?,
            lease_token: r.get(11)?,
            lease_ms: r.get(12)?,
        })
    }

    pub(super) fn meta(&self, r: &Row) -> rusqlite::Result<(ItemMeta, bool)> {
        let (ns, topic) = self.names(r.get(1)?)?;
        let state: i8 = r.get(4)?;
        Ok((
            ItemMeta {
                key: r.get::<_, i64>(0)? as u64,
                ns,
                topic,
                priority: r.get(2)?,
                deliver_after_ms: r.get(3)?,
                state: ItemState::from_i8(state).ok_or_else(|| bad(4, "state", state))?,
                delivery_count: r.get(5)?,
                max_attempts: r.get(6)?,
                policy: policy(r.get(7)?)?,
                lease_expires_ms: r.get(8)?,
                expires_at_ms: r.get(9)?,
                lease_token: r.get(10)?,
                next_event_ms: r.get(11)?,
                settled_token: r.get(13)?,
            },
            r.get::<_, i64>(12)? != 0,
        ))
    }

    /// Runs `sql`, a statement with its values in its text: prepared for this call alone
    /// (caching a text that never comes back would only push out the statements that do).
    pub(super) fn items(&self, conn: &Connection, sql: &str) -> StoreResult<Vec<Item>> {
        all(&mut conn.prepare(sql).map_err(store_error)?, [], |r| {
            self.item(r)
        })
    }

    /// Runs `sql`, a statement of fixed text, with `params` bound: prepared once per
    /// connection and reused from its statement cache.
    pub(super) fn items_bound(
        &self,
        conn: &Connection,
        sql: &str,
        params: impl rusqlite::Params,
    ) -> StoreResult<Vec<Item>> {
        all(
            &mut *conn.prepare_cached(sql).map_err(store_error)?,
            params,
            |r| self.item(r),
        )
    }

    pub(super) fn metas(&self, conn: &Connection, sql: &str) -> StoreResult<Vec<(ItemMeta, bool)>> {
        all(&mut conn.prepare(sql).map_err(store_error)?, [], |r| {
            self.meta(r)
        })
    }

    /// [`Rows::metas`] for a statement of fixed text with `params` bound (cached, as in
    /// [`Rows::items_bound`]).
    pub(super) fn metas_bound(
        &self,
        conn: &Connection,
        sql: &str,
        params: impl rusqlite::Params,
    ) -> StoreResult<Vec<(ItemMeta, bool)>> {
        all(
            &mut *conn.prepare_cached(sql).map_err(store_error)?,
            params,
            |r| self.meta(r),
        )
    }
}

/// Every row `st` gives with `params` bound, each read by `row`.
fn all<T>(
    st: &mut rusqlite::Statement<'_>,
    params: impl rusqlite::Params,
    row: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> StoreResult<Vec<T>> {
    st.query_map(params, row)
        .map_err(store_error)?
        .collect::<rusqlite::Result<Vec<_>>>()
        .map_err(store_error)
}

/// `keys` as the value of a `rarray(?N)` parameter: one bound array in place of a list
/// spelled out in the statement's text, which SQLite would parse on every call.
pub(super) fn key_array(keys: &[u64]) -> std::rc::Rc<Vec<rusqlite::types::Value>> {
    std::rc::Rc::new(
        keys.iter()
            .map(|k| rusqlite::types::Value::Integer(*k as i64))
            .collect(),
    )
}

fn bad(col: usize, what: &str, v: i8) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(
        col,
        rusqlite::types::Type::Integer,
        format!("unknown {what} {v}").into(),
    )
}

fn policy(v: i8) -> rusqlite::Result<Policy> {
    Policy::from_i32(v as i32).ok_or_else(|| bad(9, "policy", v))
}

pub(super) fn run(conn: &Connection, statements: &[Statement]) -> StoreResult<()> {
    for sql in statements {
        conn.execute_batch(sql).map_err(store_error)?;
    }
    Ok(())
}
