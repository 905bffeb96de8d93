//! [`TopicIds`]: a shard's map between topic names (namespace, topic) and the small
//! integers its rows carry instead. Names are up to 255 bytes each and led the widest
//! index of schema version 1, so every index entry carried them; an id keeps each entry a
//! few bytes, whatever the names.
//!
//! The store owns the map (loaded whole at open: one row per topic the shard has ever
//! held) and is its only writer, as the worker is the shard's only writer. A new name gets
//! the next id at once, *tentatively*: the `topics` row is written in the same transaction
//! as the first rows that use it, and the id is confirmed only when that commits. A write
//! whose outcome is unknown (a timeout) leaves it tentative, so the retry writes the same
//! id again (`INSERT` that ignores an existing row): a name never gets two ids.
//!
//! A topic that has held nothing for a while is forgotten (its row, its id), so that a
//! client making topics without end cannot grow every shard's map and table for ever (see
//! [`TopicIds::begin_forgetting`]). Its id is never given again (`next` only grows while the
//! shard is open, and at open it starts past every id still in use).

use std::collections::HashMap;

use super::{StateCount, StoreError, StoreResult};
use crate::model::{ItemState, TopicName};

#[derive(Debug, Default)]
pub struct TopicIds {
    by_name: HashMap<String, HashMap<String, (u32, bool)>>,
    names: HashMap<u32, (String, String)>,
    next: u32,
}

impl TopicIds {
    /// The map as stored: (id, ns, topic) rows.
    pub fn load(rows: impl IntoIterator<Item = (u32, String, String)>) -> TopicIds {
        let mut ids = TopicIds {
            next: 1,
            ..TopicIds::default()
        };
        for (id, ns, topic) in rows {
            ids.next = ids.next.max(id + 1);
            ids.by_name
                .entry(ns.clone())
                .or_default()
                .insert(topic.clone(), (id, true));
            ids.names.insert(id, (ns, topic));
        }
        ids
    }

    /// The id of a topic, confirmed or not; `None` when the shard never held it (then it
    /// has no rows either).
    pub fn get(&self, ns: &str, topic: &str) -> Option<u32> {
        self.by_name.get(ns)?.get(topic).map(|(id, _)| *id)
    }

    /// The id of a topic, given one when new; true when its `topics` row may still have to
    /// be written.
    pub fn assign(&mut self, ns: &str, topic: &str) -> (u32, bool) {
        if let Some((id, confirmed)) = self.by_name.get(ns).and_then(|t| t.get(topic)) {
            return (*id, !confirmed);
        }
        let id = self.next;
        self.next += 1;
        self.by_name
            .entry(ns.to_string())
            .or_default()
            .insert(topic.to_string(), (id, false));
        self.names.insert(id, (ns.to_string(), topic.to_string()));
        (id, true)
    }

    /// The `topics` rows of these ids are committed.
    pub fn confirm(&mut self, ids: &[u32]) {
        for id in ids {
            if let Some((ns, topic)) = self.names.get(id) {
                if let Some(e) = self.by_name.get_mut(ns).and_then(|t| t.get_mut(topic)) {
                    e.1 = true;
                }
            }
        }
    }

    /// The confirmed ids among `topics`, made tentative again until [`Self::forgotten`]
    /// says how their forgetting ended: a write that fails with an unknown outcome may have
    /// deleted their rows, and a tentative id has its row written again by the next write
    /// that uses it. A tentative one is left out: a write of its row may still be in doubt.
    pub fn begin_forgetting(&mut self, topics: &[TopicName]) -> Vec<u32> {
        let mut ids = Vec::new();
        for t in topics {
            if let Some(e) = self
                .by_name
                .get_mut(&t.ns)
                .and_then(|m| m.get_mut(&t.topic))
            {
                if e.1 {
                    e.1 = false;
                    ids.push(e.0);
                }
            }
        }
        ids
    }

    /// The forgetting of `ids` committed, and `kept` still have rows (they held items):
    /// the others are gone. Returns their names.
    pub fn forgotten(&mut self, ids: &[u32], kept: &[u32]) -> Vec<TopicName> {
        self.confirm(kept);
        let mut gone = Vec::new();
        for id in ids.iter().filter(|id| !kept.contains(id)) {
            if let Some((ns, topic)) = self.names.remove(id) {
                if let Some(m) = self.by_name.get_mut(&ns) {
                    m.remove(&topic);
                    if m.is_empty() {
                        self.by_name.remove(&ns);
                    }
                }
                gone.push(TopicName { ns, topic });
            }
        }
        gone
    }

    /// The (ns, topic) of an id; a row naming an id the map does not know is corrupt.
    pub fn name(&self, id: u32) -> StoreResult<(String, String)> {
        self.names
            .get(&id)
            .cloned()
            .ok_or_else(|| StoreError::Corrupt(format!("row of unknown topic id {id}")))
    }
}

/// The statements, one transaction, that forget those of `ids` that hold no item: their
/// dedup rows (left only by a crash between an item's delete and its key's) and their
/// `topics` rows (with their totals).
pub fn forget_sql(ids: &[u32]) -> Vec<String> {
    let list = id_list(ids);
    ["dedup", "topics"]
        .iter()
        .map(|table| {
            format!(
                "DELETE FROM {table} WHERE tid IN ({list}) \
                 AND NOT EXISTS (SELECT 1 FROM items i WHERE i.tid = {table}.tid)"
            )
        })
        .collect()
}

/// Which of `ids` still have their `topics` row (after [`forget_sql`]: those holding items).
pub fn kept_sql(ids: &[u32]) -> String {
    format!("SELECT tid FROM topics WHERE tid IN ({})", id_list(ids))
}

fn id_list(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// The `WHERE` of a count of `topic` (every topic: empty), given the topic's id if it has
/// one; `None`: the topic has no id, so no rows.
pub fn topic_filter(
    topic: Option<&TopicName>,
    tid: impl Fn(&TopicName) -> Option<u32>,
) -> Option<String> {
    match topic {
        None => Some(String::new()),
        Some(t) => tid(t).map(|id| format!("WHERE tid = {id}")),
    }
}

/// Rows of (topic id, state, second of `deliver_after_ms` for ready rows, count) with the
/// topics' names.
pub fn state_counts(
    topics: &std::sync::Mutex<TopicIds>,
    rows: Vec<(u32, i8, i64, i64)>,
) -> StoreResult<Vec<StateCount>> {
    let map = topics.lock().expect("topics");
    rows.into_iter()
        .map(|(tid, state, sec, n)| {
            let (ns, topic) = map.name(tid)?;
            let state = ItemState::from_i8(state)
                .ok_or_else(|| StoreError::Corrupt(format!("unknown state {state}")))?;
            Ok((ns, topic, state, sec, n))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_keeps_its_id_until_confirmed_and_after() {
        let mut ids = TopicIds::load([(3, "a".to_string(), "t".to_string())]);
        assert_eq!(ids.assign("a", "t"), (3, false));
        assert_eq!(ids.assign("a", "u"), (4, true));
        // Not confirmed: the retry writes the same id again.
        assert_eq!(ids.assign("a", "u"), (4, true));
        ids.confirm(&[4]);
        assert_eq!(ids.assign("a", "u"), (4, false));
        assert_eq!(ids.assign("b", "t"), (5, true));
        assert_eq!(ids.get("b", "t"), Some(5));
        assert_eq!(ids.get("b", "x"), None);
        assert_eq!(ids.name(4).unwrap(), ("a".to_string(), "u".to_string()));
        assert!(ids.name(99).is_err());
    }

    fn name(ns: &str, topic: &str) -> TopicName {
        TopicName {
            ns: ns.into(),
            topic: topic.into(),
        }
    }

    #[test]
    fn a_forgotten_topic_loses_its_id_and_a_kept_one_keeps_it() {
        let mut ids = TopicIds::load([(1, "a".into(), "t".into()), (2, "a".into(), "u".into())]);
        assert_eq!(ids.assign("a", "new"), (3, true));
        // The tentative one is not forgotten: its row may still be being written.
        let cands = ids.begin_forgetting(&[name("a", "t"), name("a", "u"), name("a", "new")]);
        assert_eq!(cands, vec![1, 2]);
        // Until the outcome is known, a write re-writes the rows.
        assert_eq!(ids.assign("a", "t"), (1, true));
        assert_eq!(ids.forgotten(&cands, &[2]), vec![name("a", "t")]);
        assert_eq!(ids.get("a", "t"), None);
        assert!(ids.name(1).is_err());
        assert_eq!(ids.assign("a", "u"), (2, false));
        // A forgotten name comes back with a new id.
        assert_eq!(ids.assign("a", "t"), (4, true));
    }
}
