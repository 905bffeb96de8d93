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

    /// The (ns, topic) of an id; a row naming an id the map does not know is corrupt.
    pub fn name(&self, id: u32) -> StoreResult<(String, String)> {
        self.names
            .get(&id)
            .cloned()
            .ok_or_else(|| StoreError::Corrupt(format!("row of unknown topic id {id}")))
    }
}

/// Rows of (topic id, state, second of `deliver_after_ms` for ready rows, count) with the
/// topics' names.
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
}
