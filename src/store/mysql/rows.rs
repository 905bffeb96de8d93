//! Rows of the MySQL shard as the store's types.

use mysql_async::prelude::*;

use super::MySqlStore;
use crate::model::{Item, ItemId, ItemState, Policy};
use crate::store::{ItemMeta, StoreError, StoreResult};

impl MySqlStore {
    pub(super) fn names(&self, tid: u32) -> StoreResult<(String, String)> {
        self.topics.lock().expect("topics").name(tid)
    }

    pub(super) fn item_from_row(&self, mut row: mysql_async::Row) -> StoreResult<Item> {
        let (ns, topic) = self.names(column(&mut row, 1)?)?;
        Ok(Item {
            id: ItemId {
                shard: self.shard,
                key: column(&mut row, 0)?,
            },
            ns,
            topic,
            priority: column(&mut row, 2)?,
            payload: column(&mut row, 3)?,
            metadata: column(&mut row, 4)?,
            deliver_after_ms: column(&mut row, 5)?,
            enqueued_at_ms: column(&mut row, 6)?,
            delivery_count: column(&mut row, 7)?,
            lease_expires_ms: column(&mut row, 8)?,
            policy: policy_from_db(column(&mut row, 9)?)?,
            expires_at_ms: column(&mut row, 10)?,
            lease_token: column(&mut row, 11)?,
            lease_ms: column(&mut row, 12)?,
        })
    }

    /// A row of `META_COLUMNS`, and whether the item has a dedup key.
    pub(super) fn meta_from_row(&self, mut row: mysql_async::Row) -> StoreResult<(ItemMeta, bool)> {
        let (ns, topic) = self.names(column(&mut row, 1)?)?;
        let state: i8 = column(&mut row, 4)?;
        let has_dedup: i8 = column(&mut row, 12)?;
        Ok((
            ItemMeta {
                key: column(&mut row, 0)?,
                ns,
                topic,
                priority: column(&mut row, 2)?,
                deliver_after_ms: column(&mut row, 3)?,
                state: ItemState::from_i8(state)
                    .ok_or_else(|| StoreError::Corrupt(format!("unknown state {state}")))?,
                delivery_count: column(&mut row, 5)?,
                max_attempts: column(&mut row, 6)?,
                policy: policy_from_db(column(&mut row, 7)?)?,
                lease_expires_ms: column(&mut row, 8)?,
                expires_at_ms: column(&mut row, 9)?,
                lease_token: column(&mut row, 10)?,
                // 0 is MySQL's spelling of no event (`Dialect::no_event`); NULL is an
                // older row's.
                next_event_ms: column::<Option<i64>>(&mut row, 11)?.filter(|t| *t != 0),
                settled_token: column(&mut row, 13)?,
            },
            has_dedup != 0,
        ))
    }

    pub(super) fn metas(&self, rows: Vec<mysql_async::Row>) -> StoreResult<Vec<ItemMeta>> {
        rows.into_iter()
            .map(|r| self.meta_from_row(r).map(|(m, _)| m))
            .collect()
    }
}

/// Column `i` of `row` as `T`.
pub(super) fn column<T: FromValue>(row: &mut mysql_async::Row, i: usize) -> StoreResult<T> {
    match row.take_opt::<T, usize>(i) {
        Some(Ok(v)) => Ok(v),
        Some(Err(e)) => Err(StoreError::Corrupt(format!("column {i}: {e}"))),
        None => Err(StoreError::Corrupt(format!("column {i} missing"))),
    }
}

fn policy_from_db(v: i8) -> StoreResult<Policy> {
    Policy::from_i32(v as i32).ok_or_else(|| StoreError::Corrupt(format!("unknown policy {v}")))
}
