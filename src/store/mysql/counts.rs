//! The MySQL store's counting reads: a namespace's topics with their counts, every topic's
//! totals and the full count by state at open. They
//! read, never write, and only `ShardStore`'s methods of the same names call them.

use mysql_async::prelude::*;

use super::MySqlStore;
use crate::model::{TopicCounts, TopicName, Totals};
use crate::store::sql as text;
use crate::store::topics::{state_counts, topic_filter};
use crate::store::{StateCount, StoreResult};

impl MySqlStore {
    pub(super) async fn count_topics(
        &self,
        ns: &str,
        after: Option<&str>,
        now_ms: i64,
        limit: usize,
    ) -> StoreResult<Vec<TopicCounts>> {
        let mut conn = self.conn().await?;
        let mut names = String::from("t.ns = ");
        text::push_hex(&mut names, ns.as_bytes());
        names.push_str(" AND t.topic > ");
        text::push_hex(&mut names, after.unwrap_or("").as_bytes());
        let rows: Vec<(Vec<u8>, i64, i64, i64)> = conn
            .query(format!(
                "SELECT t.topic,
                    CAST(SUM(i.state = 0 AND i.deliver_after_ms <= {now_ms}) AS SIGNED),
                    CAST(SUM(i.state = 0 AND i.deliver_after_ms > {now_ms}) AS SIGNED),
                    CAST(SUM(i.state = 1) AS SIGNED)
                 FROM topics t JOIN items i ON i.tid = t.tid
                 WHERE {names} AND i.state IN (0, 1)
                   AND (i.expires_at_ms IS NULL OR i.expires_at_ms > {now_ms})
                 GROUP BY t.topic ORDER BY t.topic LIMIT {limit}"
            ))
            .await?;
        Ok(rows
            .into_iter()
            .map(|(topic, ready, deferred, leased)| TopicCounts {
                topic: String::from_utf8_lossy(&topic).into_owned(),
                ready,
                deferred,
                leased,
                hosts: Vec::new(),
            })
            .collect())
    }

    /// Every topic's saved totals.
    pub(super) async fn read_totals(&self) -> StoreResult<Vec<(TopicName, Totals)>> {
        let mut conn = self.conn().await?;
        type Row = (Vec<u8>, Vec<u8>, i64, i64, i64, i64, i64);
        let rows: Vec<Row> = conn
            .query("SELECT ns, topic, enqueued, delivered, acked, nacked, expired FROM topics")
            .await?;
        Ok(rows
            .into_iter()
            .map(|(ns, topic, enqueued, delivered, acked, nacked, expired)| {
                (
                    TopicName {
                        ns: String::from_utf8_lossy(&ns).into_owned(),
                        topic: String::from_utf8_lossy(&topic).into_owned(),
                    },
                    Totals {
                        enqueued,
                        delivered,
                        acked,
                        nacked,
                        expired,
                    },
                )
            })
            .collect())
    }

    pub(super) async fn count_states(
        &self,
        topic: Option<&TopicName>,
    ) -> StoreResult<Vec<StateCount>> {
        let Some(only) = topic_filter(topic, |t| self.tid(&t.ns, &t.topic)) else {
            return Ok(Vec::new());
        };
        let mut conn = match topic {
            None => self.unbounded_conn().await?,
            Some(_) => self.conn().await?,
        };
        let rows: Vec<(u32, i8, i64, i64)> = conn
            .query(format!(
                "SELECT tid, state, IF(state = 0, deliver_after_ms DIV 1000, 0) AS sec, COUNT(*)
                 FROM items {only} GROUP BY tid, state, sec"
            ))
            .await?;
        state_counts(&self.topics, rows)
    }
}
