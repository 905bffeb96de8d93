//! [`ShardError`]: what a shard's callers hear when it cannot serve them, in the shard's
//! own terms. Core turns it into the API's error once (`core::shard_error`), as the shard
//! turns a [`StoreError`] into this: no layer below core speaks the wire's codes.

use crate::model::ShardId;
use crate::store::StoreError;

#[derive(Debug, Clone, thiserror::Error)]
pub enum ShardError {
    /// Its queue, or its reads beside the worker, are at their limit: retry.
    #[error("shard {shard} is busy: {why}")]
    Busy { shard: ShardId, why: String },
    /// The worker did not answer within its bound; the request may still take effect.
    #[error(
        "shard {shard} did not answer within {waited_ms} ms; the request may still take effect"
    )]
    NoAnswer { shard: ShardId, waited_ms: u64 },
    /// The worker has stopped (the shard is handed over, the host stops, or it died).
    #[error("shard {0} is shutting down")]
    Gone(ShardId),
    /// The storage failed. Retryable unless it holds what this build cannot use.
    #[error("shard {shard}: storage error: {error}")]
    Storage { shard: ShardId, error: StoreError },
    /// An enqueue's insert failed with an outcome the worker cannot know (a timeout, a
    /// lost connection): whether it committed is asked of the shard with `batch`
    /// (`ShardHandle::batch_committed`); if it did, the request's items are `planned`.
    #[error("shard {shard}: storage error: {error}")]
    InsertInDoubt {
        shard: ShardId,
        error: StoreError,
        batch: i64,
        planned: Vec<super::Enqueued>,
        /// The request's items by topic (dedup hits left out): the traffic totals to add
        /// if it did commit.
        tally: Vec<(crate::model::TopicName, i64)>,
    },
}

impl ShardError {
    /// The request went to storage (or the worker) and no answer came back within its
    /// bound: it may still take effect. (MariaDB's `max_statement_time` ends a statement,
    /// not a commit waiting for a semi-sync acknowledgement, nor one whose answer a frozen
    /// server never sent.)
    pub fn in_doubt(&self) -> bool {
        matches!(
            self,
            ShardError::NoAnswer { .. }
                | ShardError::InsertInDoubt { .. }
                | ShardError::Storage {
                    error: StoreError::Timeout(_) | StoreError::Lost(_),
                    ..
                }
        )
    }

    /// False only for stored data or a schema this build cannot use: no retry fixes it.
    pub fn retryable(&self) -> bool {
        !matches!(
            self,
            ShardError::Storage {
                error: StoreError::Corrupt(_) | StoreError::Schema(_),
                ..
            }
        )
    }
}

pub type Result<T> = std::result::Result<T, ShardError>;
