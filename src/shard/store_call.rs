//! A store call as the shard worker makes it: bounded by the shard's timeout, and its
//! failure put in the terms the shard's callers see.

use std::time::Duration;

use super::ShardError;
use crate::model::ShardId;
use crate::store::{StoreError, StoreResult};

/// Runs a storage operation under the shard's timeout; returns its outcome and how long it
/// took. A timed-out operation is dropped, so a hung server cannot hold the worker
/// forever; what it started may still finish (MySQL runs a statement on, up to its
/// `max_statement_time`; SQLite's thread finishes a job whose caller left): its outcome is
/// unknown, see `doubt.rs`.
pub(super) async fn timed<T>(
    timeout: Duration,
    f: impl std::future::Future<Output = StoreResult<T>>,
) -> (StoreResult<T>, u64) {
    let started = std::time::Instant::now();
    let r = match tokio::time::timeout(timeout, f).await {
        Ok(r) => r,
        Err(_) => Err(StoreError::Timeout(timeout.as_millis() as u64)),
    };
    (r, started.elapsed().as_millis() as u64)
}

/// A storage failure as the shard's callers see it (retryable, except data or a schema
/// this build cannot use: those are logged here, once).
pub(super) fn storage_error(id: ShardId, e: &StoreError) -> ShardError {
    if matches!(e, StoreError::Corrupt(_) | StoreError::Schema(_)) {
        tracing::error!(shard = id, error = %e, "storage holds what this build cannot use");
    }
    ShardError::Storage {
        shard: id,
        error: e.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_storage_that_no_retry_can_fix_is_final() {
        let corrupt = storage_error(3, &StoreError::Corrupt("unknown state 9".into()));
        assert!(!corrupt.retryable());
        assert!(corrupt.to_string().contains("shard 3"));
        for e in [
            StoreError::Transient("connection reset".into()),
            StoreError::Timeout(5000),
            StoreError::Fenced,
        ] {
            assert!(storage_error(3, &e).retryable(), "{e}");
        }
    }
}
