//! A shard worker's settings: the engine's keys it reads ([`WorkerConfig`]), and the bound
//! on each topic's dead items ([`DlqBounds`]).

use std::collections::HashMap;
use std::sync::Arc;

use crate::config::EngineConfig;

#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub enqueue_batch_rows_max: usize,
    pub worker_queue_max: usize,
    pub index_keys_per_topic_max: usize,
    pub index_topics_max: usize,
    pub scan_interval_ms: u64,
    pub scan_rows_max: usize,
    pub checkpoint_interval_ms: u64,
    pub topic_forget_after_ms: u64,
    pub breaker_failures_max: u32,
    pub breaker_slow_ms: u64,
    pub breaker_open_ms: u64,
    pub store_timeout_ms: u64,
    pub open_timeout_ms: u64,
    pub ack_memory_ms: u64,
    pub ack_memory_items_max: usize,
    /// Dead items a topic keeps on this shard, at most (see `dlq.rs`).
    pub dlq_bounds: DlqBounds,
    /// Whether inserts write their batch's mark (see `store::batches`).
    pub enqueue_marks: bool,
}

/// `engine.dlq_max_items_per_topic` and the namespaces' own; 0 is unbounded.
#[derive(Debug, Clone, Default)]
pub struct DlqBounds {
    pub default: u64,
    pub by_ns: Arc<HashMap<String, u64>>,
}

impl DlqBounds {
    pub fn from_config(cfg: &crate::config::Config) -> DlqBounds {
        DlqBounds {
            default: cfg.engine.dlq_max_items_per_topic,
            by_ns: Arc::new(
                cfg.namespaces
                    .iter()
                    .filter_map(|n| Some((n.name.clone(), n.dlq_max_items_per_topic?)))
                    .collect(),
            ),
        }
    }

    /// The bound of namespace `ns`'s topics, if any.
    pub fn of(&self, ns: &str) -> Option<u64> {
        Some(*self.by_ns.get(ns).unwrap_or(&self.default)).filter(|b| *b > 0)
    }
}

impl From<&EngineConfig> for WorkerConfig {
    fn from(e: &EngineConfig) -> Self {
        WorkerConfig {
            enqueue_batch_rows_max: e.enqueue_batch_rows_max,
            worker_queue_max: e.worker_queue_max,
            index_keys_per_topic_max: e.index_keys_per_topic_max,
            index_topics_max: e.index_topics_max,
            scan_interval_ms: e.scan_interval_ms,
            scan_rows_max: e.scan_rows_max,
            checkpoint_interval_ms: e.checkpoint_interval_ms,
            topic_forget_after_ms: e.topic_forget_after_ms,
            breaker_failures_max: e.breaker_failures_max,
            breaker_slow_ms: e.breaker_slow_ms,
            breaker_open_ms: e.breaker_open_ms,
            store_timeout_ms: e.store_timeout_ms,
            open_timeout_ms: e.shard_open_timeout_ms,
            ack_memory_ms: e.ack_memory_ms,
            ack_memory_items_max: e.ack_memory_items_max,
            dlq_bounds: DlqBounds {
                default: e.dlq_max_items_per_topic,
                by_ns: Default::default(),
            },
            enqueue_marks: e.enqueue_marks,
        }
    }
}
