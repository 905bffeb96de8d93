//! Who replicates from whom in a replica set, as a switch changes it: every replica
//! repointed to a new primary, the replicas chained below a switch's target before its
//! pause (and back when it is undone), and the wait for a replica that acknowledges the
//! new primary's commits.

use std::time::{Duration, Instant};

use mysql_async::prelude::*;

use super::driver::Driver;
use super::server::{self as srv};
use super::SetLayout;

/// How long the target of a switch may take to reach what another replica has applied
/// before that replica is chained below it (a replica ahead of the target cannot
/// replicate from it: its start position is not in the target's binlog yet).
const CHAIN_WAIT: Duration = Duration::from_millis(500);
/// What a chaining step may spend connecting, beside [`CHAIN_WAIT`].
const CHAIN_CONNECT: Duration = Duration::from_millis(1500);

impl Driver {
    /// Before a switch's pause: the other replicas of `set` (not `from`, not `to`)
    /// replicate from the target `to` (which logs what it applies), so that at its
    /// promotion it already has replicas connected that acknowledge its commits, and only
    /// the old primary is repointed inside the read-only window. Each replica is stopped,
    /// the target waits (at most [`CHAIN_WAIT`]) until it has applied all that replica
    /// has, and only then is the replica moved; one the target does not reach in time
    /// replicates from `from` again, and is repointed after the promotion as before.
    /// Returns what could not be chained.
    pub(super) async fn chain(&self, set: &SetLayout, from: &str, to: &str) -> Vec<String> {
        // Its own bound, shorter than a switch step's: the pause waits for it.
        let bound = CHAIN_WAIT + 2 * CHAIN_CONNECT;
        let ch = self.cfg.channel();
        let others = set
            .servers
            .iter()
            .filter(|s| s.addr != from && s.addr != to);
        let results = futures::future::join_all(others.map(|s| {
            let (ch, admin, target) = (ch.clone(), self.admin(&s.addr), self.admin(to));
            let to = to.to_string();
            async move {
                admin
                    .with(bound, |c| {
                        Box::pin(async move {
                            c.query_drop("STOP SLAVE")
                                .await
                                .map_err(|e| e.to_string())?;
                            let moved = async {
                                let pos: Option<String> = c
                                    .query_first("SELECT @@global.gtid_current_pos")
                                    .await
                                    .map_err(|e| e.to_string())?;
                                let pos = pos.unwrap_or_default();
                                let reached = target
                                    .with(CHAIN_WAIT + CHAIN_CONNECT, |t| {
                                        let pos = pos.clone();
                                        Box::pin(async move {
                                            srv::wait_for(t, &pos, CHAIN_WAIT).await
                                        })
                                    })
                                    .await;
                                if reached != Ok(true) {
                                    return Err(format!(
                                        "{to} did not reach {pos} within {CHAIN_WAIT:?} ({reached:?})"
                                    ));
                                }
                                srv::follow(c, &to, &ch).await
                            }
                            .await;
                            if moved.is_err() {
                                // Replicating from the old primary again, as before.
                                let _ = c.query_drop("START SLAVE").await;
                            }
                            moved
                        })
                    })
                    .await
            }
        }))
        .await;
        results.into_iter().filter_map(Result::err).collect()
    }

    /// After a switch undone: the replicas chained below its target (see `switch_locked`)
    /// replicate from the old primary again (those that already do are left alone).
    pub(super) async fn unchain(&self, set: &SetLayout, from: &str) {
        let problems = self.repoint(set, from, None, false).await;
        if !problems.is_empty() {
            tracing::warn!(shards = ?set.shards, primary = from, ?problems, "switch undo: not every replica follows the old primary again");
        }
    }

    /// Every server of `set` but `primary` (and `skip`) replicates from `primary`.
    /// With `semi`, waits (briefly) until a replica that acknowledges commits is connected.
    pub(super) async fn repoint(
        &self,
        set: &SetLayout,
        primary: &str,
        skip: Option<&str>,
        semi: bool,
    ) -> Vec<String> {
        let bound = self.step_bound();
        let ch = self.cfg.channel();
        let others = set
            .servers
            .iter()
            .filter(|s| s.addr != primary && Some(s.addr.as_str()) != skip);
        let results = futures::future::join_all(others.map(|s| {
            let ch = ch.clone();
            let admin = self.admin(&s.addr);
            let primary = primary.to_string();
            async move {
                admin
                    .with(bound, |c| {
                        Box::pin(async move {
                            // Already replicating from it (chained below the target before
                            // the switch's pause): left alone, so that it stays connected
                            // and acknowledges the new primary's first commits.
                            if let Some(st) = srv::replica_status(c).await? {
                                if st.master == primary && st.io_running && st.sql_running {
                                    return Ok(());
                                }
                            }
                            srv::follow(c, &primary, &ch).await
                        })
                    })
                    .await
            }
        }))
        .await;
        let mut problems: Vec<String> = results.into_iter().filter_map(Result::err).collect();
        if semi {
            let admin = self.admin(primary);
            let mut c = srv::Kept::open(&admin).await;
            problems.extend(self.semi_ready(&mut c, primary).await);
            c.close().await;
        }
        problems
    }

    /// Waits (at most 2 s) until `primary` has a replica connected that acknowledges its
    /// commits; says so when none came.
    pub(super) async fn semi_ready(&self, c: &mut srv::Kept<'_>, primary: &str) -> Option<String> {
        let end = Instant::now() + Duration::from_secs(2);
        loop {
            let s = c
                .step(self.step_bound(), |c| Box::pin(srv::semi_sync(c)))
                .await;
            if matches!(&s, Ok(s) if s.clients > 0) {
                return None;
            }
            if Instant::now() >= end {
                return Some(format!("no semi-sync replica connected to {primary} yet"));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
