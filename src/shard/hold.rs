//! A worker held through a planned switch of its shard's replica set (see
//! [`Command::Hold`] and `Host::hold_shard`): it stops writing, keeps what it knows, and
//! goes on once its store has moved to the new primary.

use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::worker::{timed, ShardWorker};
use super::Command;
use crate::store::ShardStore;

/// Where a held worker goes on (see [`Command::Hold`]): its store moved to `to`
/// ([`crate::store::ShardStore::retarget`]); `moved` answers whether it could. A worker
/// whose store could not move stops without another write.
pub struct Resume {
    pub to: crate::store::Retarget,
    pub moved: oneshot::Sender<std::result::Result<(), String>>,
}

impl<S: ShardStore> ShardWorker<S> {
    /// A hold (see [`Command::Hold`]): with `flush`, what was put off written, the
    /// leases nobody was handed given back, the checkpoints saved; then nothing until
    /// `resume`. True when resumed on a store that moved; false to stop.
    pub(super) async fn held(
        &mut self,
        held: oneshot::Sender<()>,
        mut resume: oneshot::Receiver<Resume>,
        flush: bool,
        rx: &mut mpsc::Receiver<Command>,
    ) -> bool {
        if flush {
            while !self.deferred.is_empty() {
                let put_off = std::mem::take(&mut self.deferred);
                self.turn(put_off).await;
            }
            self.release_unseen().await;
            self.publish_events();
            self.save_checkpoints(true).await;
        }
        let _ = held.send(());
        tracing::info!(
            shard = self.id,
            "shard worker held for a switch of its replica set"
        );
        // Commands that still reach it (from callers that took its handle before it was
        // held) are refused at once, as gone: nothing of them is applied, and the caller
        // retries where the shard is served, rather than waiting (perhaps past its bound,
        // its outcome then unknown) for a hold that may last.
        let mut open = true;
        let resumed = loop {
            tokio::select! {
                r = &mut resume => break r,
                c = rx.recv(), if open => match c {
                    Some(c) => drop(c),
                    None => open = false,
                },
            }
        };
        let Ok(Resume { to, moved }) = resumed else {
            return false;
        };
        let bound = Duration::from_millis(self.cfg.open_timeout_ms);
        match timed(bound, self.store.retarget(&to)).await.0 {
            Ok(()) => {
                let _ = moved.send(Ok(()));
                tracing::info!(
                    shard = self.id,
                    "held shard worker resumed on the new primary"
                );
                true
            }
            Err(e) => {
                tracing::warn!(shard = self.id, error = %e, "a held shard's store could not move; the shard is reopened");
                let _ = moved.send(Err(e.to_string()));
                false
            }
        }
    }
}
