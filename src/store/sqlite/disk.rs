//! The shard's file on its disk: where a `sqlite://` url puts it, whether the disk has room
//! for a batch (the breaker's probe), and a full disk simulated for tests.

use std::path::{Path, PathBuf};

#[cfg(feature = "faults")]
use super::conn::store_error;
use super::SqliteStore;
use crate::store::{StoreError, StoreResult};

/// The path of a `sqlite://PATH` url; a relative path is relative to `base` (the config
/// file's folder).
pub fn sqlite_path(url: &str, base: &Path) -> Option<PathBuf> {
    let p = url.strip_prefix("sqlite://")?;
    if p.is_empty() {
        return None;
    }
    let p = Path::new(p);
    Some(if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    })
}

/// Bytes the breaker's probe writes (and rolls back): about one batch of items, so that a
/// disk with no room for a batch fails it (`SELECT 1` passes on a full disk).
pub(super) const PROBE_BYTES: usize = 64 * 1024;

/// Writes `PROBE_BYTES` to `scratch`, syncs and removes it: fails when the disk has no
/// room for them (a write or the fsync says `ENOSPC`).
pub(super) fn room_on_disk(scratch: &Path) -> StoreResult<()> {
    use std::io::Write;
    let fail = |e: std::io::Error| {
        let _ = std::fs::remove_file(scratch);
        StoreError::Transient(format!("no room on the disk ({}): {e}", scratch.display()))
    };
    let mut f = std::fs::File::create(scratch).map_err(fail)?;
    f.write_all(&[0u8; PROBE_BYTES]).map_err(fail)?;
    f.sync_all().map_err(fail)?;
    drop(f);
    std::fs::remove_file(scratch).map_err(fail)
}

impl SqliteStore {
    /// Makes the file as good as full (`full`: no page may be added to it, as on a disk
    /// with no room; SQLite then fails with `SQLITE_FULL`) or lets it grow again. For
    /// tests of a full disk without one; on the writer's connection only.
    #[cfg(feature = "faults")]
    pub async fn simulate_full_disk(&self, full: bool) -> StoreResult<()> {
        self.call(move |conn| {
            let pages: i64 = if full {
                conn.query_row("PRAGMA page_count", [], |r| r.get(0))
                    .map_err(store_error)?
            } else {
                i64::from(u32::MAX - 1)
            };
            conn.query_row(&format!("PRAGMA max_page_count = {pages}"), [], |_| Ok(()))
                .map_err(store_error)
        })
        .await
    }
}
