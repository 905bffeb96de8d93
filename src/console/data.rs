//! What each console page shows, as plain serializable structs: the HTML pages render
//! them and `/api/v1/` returns them as JSON, so a script sees what an operator sees.
//! Everything here is read through the host's own calls (peek never leases), under the
//! console's caller, so `[[access]]` rules apply to the console as to any client.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Instant;

use serde::Serialize;

use super::series::Rates;
use super::Console;
use crate::core::{Kind, NamespaceRow, TopicRow};
use crate::error::Result;
use crate::model::{Item, Totals};

/// Bytes of a payload or metadata shown in a preview.
pub const PREVIEW_BYTES: usize = 200;
/// Topics on one page of the topic list, unless asked otherwise (at most `TOPICS_PAGE_MAX`).
pub const TOPICS_PAGE_DEFAULT: usize = 50;
pub const TOPICS_PAGE_MAX: usize = 500;
/// Items a topic page peeks at, unless asked otherwise (at most 100).
pub const PEEK_DEFAULT: i32 = 20;
pub const PEEK_MAX: i32 = 100;

#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct StateCounts {
    pub ready: i64,
    pub deferred: i64,
    pub leased: i64,
    pub dead: i64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ShardRow {
    pub shard: u32,
    pub state: &'static str,
    pub healthy: bool,
    pub items: i64,
}

impl ShardRow {
    /// A shard of a peer that did not answer: its state is not known.
    fn unknown(shard: u32) -> ShardRow {
        ShardRow {
            shard,
            state: "unknown",
            healthy: false,
            items: 0,
        }
    }

    fn of(s: &crate::model::ShardStatus) -> ShardRow {
        ShardRow {
            shard: s.shard,
            state: s.state.label(),
            healthy: s.healthy,
            items: s.items,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct PeerRow {
    pub host_id: String,
    pub addr: String,
    pub tier: String,
    /// Its shards, with their states as its last poll said (none while unreachable).
    pub shards: Vec<ShardRow>,
    pub reachable: bool,
    pub spare: i64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Overview {
    pub host_id: String,
    pub addr: String,
    pub tier: String,
    pub manager: &'static str,
    /// This host's shards' items, every namespace together.
    pub items: StateCounts,
    pub rates: Rates,
    pub namespaces: usize,
    pub shards: Vec<ShardRow>,
    pub peers: Vec<PeerRow>,
}

#[derive(Debug, Clone, Serialize)]
pub struct NamespaceView {
    #[serde(flatten)]
    pub row: NamespaceRow,
    pub rates: Rates,
}

/// How the topic list is ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TopicSort {
    #[default]
    Name,
    Ready,
    Deferred,
    Leased,
    Dead,
    Age,
}

impl TopicSort {
    pub const ALL: [TopicSort; 6] = [
        TopicSort::Name,
        TopicSort::Ready,
        TopicSort::Deferred,
        TopicSort::Leased,
        TopicSort::Dead,
        TopicSort::Age,
    ];

    pub fn name(self) -> &'static str {
        match self {
            TopicSort::Name => "name",
            TopicSort::Ready => "ready",
            TopicSort::Deferred => "deferred",
            TopicSort::Leased => "leased",
            TopicSort::Dead => "dead",
            TopicSort::Age => "age",
        }
    }
}

/// The topic list's query: a name filter (substring), an order and a page.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TopicQuery {
    pub q: String,
    pub sort: TopicSort,
    pub offset: usize,
    pub limit: Option<usize>,
}

#[derive(Debug, Clone, Serialize)]
pub struct TopicList {
    pub ns: String,
    pub q: String,
    pub sort: TopicSort,
    pub offset: usize,
    pub limit: usize,
    /// Topics that match the filter (all pages).
    pub total: usize,
    pub topics: Vec<TopicRow>,
}

/// An item as the console shows it: previews are lossy UTF-8 of the first
/// [`PREVIEW_BYTES`] bytes (escaped when rendered, like every value).
#[derive(Debug, Clone, Serialize)]
pub struct ItemView {
    pub id: String,
    pub priority: i32,
    pub deliver_after_ms: i64,
    pub enqueued_at_ms: i64,
    pub deliveries: i32,
    pub payload_bytes: usize,
    pub payload_preview: String,
    pub metadata_preview: String,
    /// For dead letters: when it died.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub died_at_ms: Option<i64>,
}

fn preview(b: &[u8]) -> String {
    let cut = &b[..b.len().min(PREVIEW_BYTES)];
    let mut s = String::from_utf8_lossy(cut).into_owned();
    if b.len() > PREVIEW_BYTES {
        s.push('…');
    }
    s
}

impl ItemView {
    pub fn of(i: &Item, died_at_ms: Option<i64>) -> ItemView {
        ItemView {
            id: i.id.to_string(),
            priority: i.priority,
            deliver_after_ms: i.deliver_after_ms,
            enqueued_at_ms: i.enqueued_at_ms,
            deliveries: i.delivery_count,
            payload_bytes: i.payload.len(),
            payload_preview: preview(&i.payload),
            metadata_preview: preview(&i.metadata),
            died_at_ms,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct TopicView {
    pub ns: String,
    pub topic: String,
    /// Over the tier, as `topicStats` says.
    pub items: StateCounts,
    pub oldest_ready_age_ms: i64,
    pub totals: Totals,
    /// Since this topic's previous view (absent on the first).
    pub rates: Option<Rates>,
    /// The next items in delivery order, none of them leased by looking.
    pub next: Vec<ItemView>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DlqPage {
    pub ns: String,
    pub topic: String,
    pub dead: i64,
    pub items: Vec<ItemView>,
    /// The cursor of the next page; absent on the last.
    pub next: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ClusterHost {
    pub host_id: String,
    pub addr: String,
    pub tier: String,
    pub region: String,
    /// Its shards and their states (this host's now; a peer's as its last poll said;
    /// `unknown` for a peer that did not answer).
    pub shards: Vec<ShardRow>,
    pub this_host: bool,
    /// Absent for a peer this host does not poll (see `cluster.peer_fanout`).
    pub reachable: Option<bool>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ClusterShard {
    pub shard: u32,
    pub owner: Option<String>,
    /// A replicated shard's primary server and its state.
    pub primary: Option<String>,
    pub primary_state: Option<String>,
    pub generation: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ClusterPage {
    pub host_id: String,
    pub manager: &'static str,
    pub tiers: BTreeMap<String, Vec<String>>,
    pub hosts: Vec<ClusterHost>,
    pub shards: Vec<ClusterShard>,
}

/// The totals last sampled of each topic viewed, so a topic page can show rates: a new
/// sample is taken when the last is at least a second old, and the rates between the two
/// last samples are shown meanwhile, so viewers refreshing at once see the same figures.
/// Bounded: past [`RATE_TOPICS_MAX`] topics it starts over.
#[derive(Default)]
pub struct TopicRates(Mutex<HashMap<(String, String), TopicSample>>);
const RATE_TOPICS_MAX: usize = 1000;

struct TopicSample {
    at: Instant,
    totals: Totals,
    rates: Option<Rates>,
}

impl TopicRates {
    fn rates(&self, ns: &str, topic: &str, now: Totals) -> Option<Rates> {
        let mut m = self.0.lock().expect("not poisoned");
        let key = (ns.to_string(), topic.to_string());
        if !m.contains_key(&key) && m.len() >= RATE_TOPICS_MAX {
            m.clear();
        }
        let Some(last) = m.get_mut(&key) else {
            m.insert(
                key,
                TopicSample {
                    at: Instant::now(),
                    totals: now,
                    rates: None,
                },
            );
            return None;
        };
        let dt = last.at.elapsed().as_secs_f64();
        if dt < 1.0 {
            return last.rates;
        }
        let r = |a: i64, b: i64| (b - a).max(0) as f64 / dt;
        // A sample older than two minutes is too old to make a rate of "now".
        let rates = (dt <= 120.0).then(|| Rates {
            enqueued: r(last.totals.enqueued, now.enqueued),
            delivered: r(last.totals.delivered, now.delivered),
            acked: r(last.totals.acked, now.acked),
        });
        *last = TopicSample {
            at: Instant::now(),
            totals: now,
            rates,
        };
        rates
    }
}

impl Console {
    pub fn overview(&self) -> Overview {
        let host = &self.host;
        let status = host.host_status(&self.caller);
        let states = host.peer_shard_states();
        let rows = self.visible_namespaces();
        let mut items = StateCounts::default();
        for r in &rows {
            items.ready += r.ready;
            items.deferred += r.deferred;
            items.leased += r.leased;
            items.dead += r.dead;
        }
        Overview {
            host_id: status.host_id,
            addr: status.addr,
            tier: status.tier,
            manager: status.manager,
            items,
            rates: self.series.host_rates(),
            namespaces: rows.len(),
            shards: status.shards.iter().map(ShardRow::of).collect(),
            peers: status
                .peers
                .into_iter()
                .map(|p| PeerRow {
                    shards: match states.get(&p.host_id) {
                        Some(s) => s.iter().map(ShardRow::of).collect(),
                        None => p.shards.iter().map(|&s| ShardRow::unknown(s)).collect(),
                    },
                    host_id: p.host_id,
                    addr: p.addr,
                    tier: p.tier,
                    reachable: p.load.reachable,
                    spare: p.load.spare,
                })
                .collect(),
        }
    }

    /// This host's namespaces that the console's identity may read.
    fn visible_namespaces(&self) -> Vec<NamespaceRow> {
        let mut rows = self.host.namespace_rows();
        rows.retain(|r| self.host.allows(&self.caller, &r.ns, Kind::Consume));
        rows
    }

    pub fn namespaces(&self) -> Vec<NamespaceView> {
        self.visible_namespaces()
            .into_iter()
            .map(|row| NamespaceView {
                rates: self.series.ns_rates(&row.ns),
                row,
            })
            .collect()
    }

    /// A page of a namespace's topics; past the end, the last page when `clamp` (a page
    /// someone follows a link to), else an empty one (a script paging to the end).
    pub fn topics(&self, ns: &str, q: &TopicQuery, clamp: bool) -> Result<TopicList> {
        crate::core::check_name("ns", ns)?;
        self.host.check_namespace(ns)?;
        if !self.host.allows(&self.caller, ns, Kind::Consume) {
            return Err(crate::core::denied(&self.caller, ns, Kind::Consume));
        }
        let limit = q
            .limit
            .unwrap_or(TOPICS_PAGE_DEFAULT)
            .clamp(1, TOPICS_PAGE_MAX);
        let mut rows: Vec<TopicRow> = self
            .host
            .topic_rows(ns)
            .into_iter()
            .filter(|t| q.q.is_empty() || t.topic.contains(q.q.as_str()))
            .collect();
        // Biggest first for counts and age; ties (and `name`) by name.
        let key = |t: &TopicRow| match q.sort {
            TopicSort::Name => 0,
            TopicSort::Ready => t.ready,
            TopicSort::Deferred => t.deferred,
            TopicSort::Leased => t.leased,
            TopicSort::Dead => t.dead,
            TopicSort::Age => t.oldest_ready_age_ms,
        };
        rows.sort_by(|a, b| key(b).cmp(&key(a)).then_with(|| a.topic.cmp(&b.topic)));
        let total = rows.len();
        // Past the end: the last page.
        let offset = if clamp && q.offset >= total {
            total.saturating_sub(1) / limit * limit
        } else {
            q.offset
        };
        let topics = rows.into_iter().skip(offset).take(limit).collect();
        Ok(TopicList {
            ns: ns.to_string(),
            q: q.q.clone(),
            sort: q.sort,
            offset,
            limit,
            total,
            topics,
        })
    }

    pub async fn topic(&self, ns: &str, topic: &str, count: Option<i32>) -> Result<TopicView> {
        let count = count.unwrap_or(PEEK_DEFAULT).clamp(1, PEEK_MAX);
        let (stats, age) = self
            .host
            .topic_stats(&self.caller, ns, topic, false)
            .await?;
        let next = self
            .host
            .peek(&self.caller, ns, topic, count, false)
            .await?;
        Ok(TopicView {
            ns: ns.to_string(),
            topic: topic.to_string(),
            items: StateCounts {
                ready: stats.ready,
                deferred: stats.deferred,
                leased: stats.leased,
                dead: stats.dead,
            },
            oldest_ready_age_ms: age,
            totals: stats.totals,
            rates: self.topic_rates.rates(ns, topic, stats.totals),
            next: next.iter().map(|i| ItemView::of(i, None)).collect(),
        })
    }

    pub async fn dlq(
        &self,
        ns: &str,
        topic: &str,
        after: Option<String>,
        limit: Option<i32>,
    ) -> Result<DlqPage> {
        let (items, next) = self
            .host
            .dlq_list(&self.caller, ns, topic, limit, after, false)
            .await?;
        let (stats, _) = self
            .host
            .topic_stats(&self.caller, ns, topic, false)
            .await?;
        Ok(DlqPage {
            ns: ns.to_string(),
            topic: topic.to_string(),
            dead: stats.dead,
            items: items
                .iter()
                .map(|(i, died)| ItemView::of(i, Some(*died)))
                .collect(),
            next,
        })
    }

    pub fn cluster(&self) -> ClusterPage {
        let status = self.host.host_status(&self.caller);
        let view = self.host.cluster_view();
        let states = self.host.peer_shard_states();
        let rows = |s: &[crate::model::ShardStatus]| -> Vec<ShardRow> {
            s.iter().map(ShardRow::of).collect()
        };
        let reachable: HashMap<&str, bool> = status
            .peers
            .iter()
            .map(|p| (p.host_id.as_str(), p.load.reachable))
            .collect();
        let mut tiers: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let hosts = view
            .hosts
            .iter()
            .map(|(id, h)| {
                tiers.entry(h.tier.clone()).or_default().push(id.clone());
                let this_host = *id == status.host_id;
                ClusterHost {
                    host_id: id.clone(),
                    addr: h.addr.clone(),
                    tier: h.tier.clone(),
                    region: h.region.clone(),
                    shards: if this_host {
                        rows(&status.shards)
                    } else if let Some(s) = states.get(id) {
                        rows(s)
                    } else {
                        view.shards_of(id)
                            .into_iter()
                            .map(ShardRow::unknown)
                            .collect()
                    },
                    this_host,
                    reachable: match this_host {
                        true => Some(true),
                        false => reachable.get(id.as_str()).copied(),
                    },
                }
            })
            .collect();
        let mut ids: Vec<u32> = view.owners.keys().copied().collect();
        ids.extend(view.primaries.keys().copied());
        ids.extend(status.shards.iter().map(|s| s.shard));
        ids.sort_unstable();
        ids.dedup();
        let shards = ids
            .into_iter()
            .map(|id| {
                let p = view.primaries.get(&id);
                ClusterShard {
                    shard: id,
                    owner: view.owners.get(&id).cloned(),
                    primary: p.map(|p| p.addr.clone()),
                    primary_state: p.map(|p| format!("{:?}", p.state).to_lowercase()),
                    generation: p.map(|p| p.generation),
                }
            })
            .collect();
        ClusterPage {
            host_id: status.host_id,
            manager: status.manager,
            tiers,
            hosts,
            shards,
        }
    }
}
