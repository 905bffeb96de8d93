//! The SQLite store's counting reads: a namespace's topics with their counts, every topic's
//! totals and the full count by state at open. They
//! read, never write, and only `ShardStore`'s methods of the same names call them.

use super::conn::store_error;
use super::SqliteStore;
use crate::model::{TopicCounts, TopicName, Totals};
use crate::store::topics::{state_counts, topic_filter};
use crate::store::{StateCount, StoreResult};

impl SqliteStore {
    pub(super) async fn count_topics(
        &self,
        ns: &str,
        after: Option<&str>,
        now_ms: i64,
        limit: usize,
    ) -> StoreResult<Vec<TopicCounts>> {
        let (ns, after) = (
            ns.as_bytes().to_vec(),
            after.unwrap_or("").as_bytes().to_vec(),
        );
        self.read(move |conn| {
            let mut st = conn
                .prepare(&format!(
                    "SELECT t.topic,
                        SUM(i.state = 0 AND i.deliver_after_ms <= {now_ms}),
                        SUM(i.state = 0 AND i.deliver_after_ms > {now_ms}),
                        SUM(i.state = 1)
                     FROM topics t JOIN items i ON i.tid = t.tid
                     WHERE t.ns = ?1 AND t.topic > ?2 AND i.state IN (0, 1)
                       AND (i.expires_at_ms IS NULL OR i.expires_at_ms > {now_ms})
                     GROUP BY t.topic ORDER BY t.topic LIMIT {limit}"
                ))
                .map_err(store_error)?;
            let out = st
                .query_map(rusqlite::params![ns, after], |r| {
                    let topic: Vec<u8> = r.get(0)?;
                    Ok(TopicCounts {
                        topic: String::from_utf8_lossy(&topic).into_owned(),
                        ready: r.get(1)?,
                        deferred: r.get(2)?,
                        leased: r.get(3)?,
                        hosts: Vec::new(),
                    })
                })
                .map_err(store_error)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(store_error)?;
            Ok(out)
        })
        .await
    }

    /// Every topic's saved totals.
    pub(super) async fn read_totals(&self) -> StoreResult<Vec<(TopicName, Totals)>> {
        self.read(move |conn| {
            let mut st = conn
                .prepare(
                    "SELECT ns, topic, enqueued, delivered, acked, nacked, expired FROM topics",
                )
                .map_err(store_error)?;
            let out = st
                .query_map([], |r| {
                    let (ns, topic): (Vec<u8>, Vec<u8>) = (r.get(0)?, r.get(1)?);
                    Ok((
                        TopicName {
                            ns: String::from_utf8_lossy(&ns).into_owned(),
                            topic: String::from_utf8_lossy(&topic).into_owned(),
                        },
                        Totals {
                            enqueued: r.get(2)?,
                            delivered: r.get(3)?,
                            acked: r.get(4)?,
                            nacked: r.get(5)?,
                            expired: r.get(6)?,
                        },
                    ))
                })
                .map_err(store_error)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(store_error)?;
            Ok(out)
        })
        .await
    }

    pub(super) async fn count_states(
        &self,
        topic: Option<&TopicName>,
    ) -> StoreResult<Vec<StateCount>> {
        let Some(only) = topic_filter(topic, |t| self.tid(&t.ns, &t.topic)) else {
            return Ok(Vec::new());
        };
        let rows = self
            .read(move |conn| {
                let mut st = conn
                    .prepare(&format!(
                        "SELECT tid, state, CASE WHEN state = 0 THEN deliver_after_ms / 1000 ELSE 0 END AS sec, COUNT(*)
                         FROM items {only} GROUP BY tid, state, sec"
                    ))
                    .map_err(store_error)?;
                let rows = st
                    .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
                    .map_err(store_error)?
                    .collect::<rusqlite::Result<Vec<_>>>()
                    .map_err(store_error)?;
                Ok(rows)
            })
            .await?;
        state_counts(&self.topics, rows)
    }
}
