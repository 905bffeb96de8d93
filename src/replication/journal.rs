//! One switch of a replica set at a time, and what outlives its driver: the set's switch
//! lock (`P/switching/<servers>`, under a lease of the driver's that lapses within the
//! cluster's `lease_ttl_ms` when the driver dies) and the switch's journal
//! (`P/switch/<servers>`, no lease), written before each step that changes a server:
//!
//! | journal step | what may have happened             | the next driver        |
//! |--------------|------------------------------------|------------------------|
//! | `pausing`    | shards paused                      | undoes (serves them)   |
//! | `read_only`  | old primary read-only              | undoes (writable again)|
//! | `fencing`    | (failover) shards fenced, replicas stopped receiving | undoes, as a refused failover does |
//! | `promoting`  | target caught up, maybe promoted   | finishes the switch    |
//!
//! The final publish (or the undo's) deletes the journal in the same etcd transaction, so
//! a journal exists exactly while a switch is neither done nor undone. Every step is
//! idempotent: making a server writable or read-only, promoting (replication stopped and
//! reset), repointing, publishing by revision. The next driver is the leader of the set
//! (the host owning its lowest shard, every second while the records say `paused`) or the
//! next switch or failover asked of the set, whichever takes the lock first. Vitess keeps
//! no such journal (a failed PlannedReparentShard is repaired by the next reparent, or by
//! VTOrc); orchestrator neither. Here paused shards serve nobody, so waiting for an
//! operator is an outage: the journal bounds it by the lock's lease.
//!
//! The last steps of a journaled failover live here too ([`undo_failover`],
//! [`complete_failover`]): the live failover (`failover.rs`) and the settle below both end
//! a failover with them, so neither file needs the other.

use std::time::{Duration, Instant};

use etcd_client::TxnOp;
use serde::{Deserialize, Serialize};

use super::driver::{Driver, Lock, SetRecords};
use super::server::{self as srv};
use super::SetLayout;
use crate::cluster::primaries::{self, Demoted};
use crate::model::{PrimaryRecord, PrimaryState};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    Pausing,
    ReadOnly,
    Fencing,
    Promoting,
}

/// Where a switch under way got to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Journal {
    pub from: String,
    pub to: String,
    pub to_region: String,
    /// The generation the switch publishes (its pause's).
    pub generation: u64,
    pub step: Step,
    /// The host that drove it.
    pub driver: String,
    /// An unplanned failover (its records say `fenced`), not a planned switch (`paused`).
    #[serde(default)]
    pub failover: bool,
}

/// The name of a set's lock and journal: its servers, so any host names them alike.
fn name(set: &SetLayout) -> String {
    let mut names: Vec<&str> = set.servers.iter().map(|s| s.addr.as_str()).collect();
    names.sort_unstable();
    names.join(",")
}

impl Driver {
    fn journal_key(&self, set: &SetLayout) -> String {
        primaries::key(&self.prefix, "switch", name(set))
    }

    /// The etcd operation that ends `set`'s journal (with the publish that ends a switch).
    pub(super) fn journal_end(&self, set: &SetLayout) -> TxnOp {
        TxnOp::delete(self.journal_key(set), None)
    }

    pub(super) async fn journal(&self, set: &SetLayout) -> Result<Option<Journal>, String> {
        let mut client = self.client.clone();
        let v = primaries::get(&mut client, &self.journal_key(set))
            .await
            .map_err(|e| format!("etcd: {e}"))?;
        Ok(v.and_then(|v| serde_json::from_slice(&v).ok()))
    }

    /// Records `j` while `lock` is held (an error when it is not: another driver owns the
    /// set now, and this one must not touch its servers).
    pub(super) async fn write_journal(
        &self,
        set: &SetLayout,
        lock: &Lock,
        j: &Journal,
    ) -> Result<(), String> {
        let mut client = self.client.clone();
        let ok = primaries::put_if_locked(
            &mut client,
            self.journal_key(set),
            serde_json::to_vec(j).expect("serializable"),
            (&lock.key, lock.lease),
        )
        .await
        .map_err(|e| format!("etcd: {e}"))?;
        if ok {
            Ok(())
        } else {
            Err("this host lost the set's switch lock; the next driver settles the switch".into())
        }
    }

    /// Runs `f` holding `set`'s switch lock, renewed meanwhile. The lock's lease is the
    /// cluster's host lease TTL: a driver that dies frees the set that long after. A driver
    /// that cannot renew it stops where it is (as if it had died) and says so.
    pub(super) async fn locked<F, Fut, T>(&self, set: &SetLayout, f: F) -> Result<T, String>
    where
        F: FnOnce(Lock) -> Fut,
        Fut: std::future::Future<Output = Result<T, String>>,
    {
        let mut client = self.client.clone();
        let name = name(set);
        let ttl_s = self.lock_ttl_s.max(1);
        let lease = primaries::lock(&mut client, &self.prefix, &name, &self.host_id, ttl_s)
            .await
            .map_err(|e| format!("etcd: {e}"))?
            .ok_or_else(|| {
                format!(
                    "another switch of the replica set of shards {:?} is under way",
                    set.shards
                )
            })?;
        let lock = Lock {
            key: primaries::key(&self.prefix, "switching", &name),
            lease,
        };
        let ttl = Duration::from_secs(ttl_s as u64);
        let keep = async {
            let Ok((mut keeper, mut stream)) = client.clone().lease_keep_alive(lease).await else {
                return;
            };
            // Counted from when the last renewal that etcd granted was sent: the lease
            // runs at least `ttl` from then. The driver stops a third of it earlier, so
            // that it has stopped before another can take the lock.
            let mut renewed = Instant::now();
            loop {
                tokio::time::sleep(ttl / 3).await;
                let sent = Instant::now();
                let answer = match keeper.keep_alive().await {
                    Ok(()) => tokio::time::timeout(ttl / 3, stream.message()).await,
                    Err(_) => Ok(Ok(None)),
                };
                match answer {
                    // The lease is gone: another driver may hold the lock already.
                    Ok(Ok(Some(r))) if r.ttl() <= 0 => return,
                    Ok(Ok(Some(_))) => renewed = sent,
                    _ if renewed.elapsed() >= ttl * 2 / 3 => return,
                    _ => tracing::warn!("etcd: cannot renew the switch lock yet"),
                }
            }
        };
        let r = tokio::select! {
            r = f(lock) => r,
            () = keep => Err(format!(
                "lost the switch lock of shards {:?} (its lease ended); the next driver finishes or undoes the switch",
                set.shards
            )),
        };
        primaries::unlock(&mut client, lease).await;
        r
    }

    /// The shards served again on the primary `recs` name (a switch or failover undone),
    /// the journal ended with that publish.
    pub(super) async fn serve_again(
        &self,
        set: &SetLayout,
        recs: &SetRecords,
        lock: &Lock,
    ) -> Result<SetRecords, String> {
        let back = PrimaryRecord {
            state: PrimaryState::Serving,
            next_region: None,
            ..recs.current.clone()
        };
        self.publish_also(recs, back, vec![self.journal_end(set)], lock)
            .await
    }

    /// The last step of a switch or failover that got to `promoting`: this host still
    /// the set's driver, the shards served on `j.to` at the switch's generation, the
    /// journal ended with that publish.
    pub(super) async fn serve_target(
        &self,
        set: &SetLayout,
        recs: &SetRecords,
        j: &Journal,
        lock: &Lock,
    ) -> Result<(), String> {
        // Still the set's driver? (One that lost its lock leaves the rest to the next.)
        self.write_journal(set, lock, j).await?;
        self.publish_final(
            set,
            recs,
            PrimaryRecord {
                addr: j.to.clone(),
                region: j.to_region.clone(),
                generation: j.generation,
                state: PrimaryState::Serving,
                next_region: None,
            },
            lock,
        )
        .await
        .map(|_| ())
    }

    /// Finishes or undoes the switch `set`'s journal records, if any (under its lock);
    /// what was done, for the log.
    pub(super) async fn settle(
        &self,
        set: &SetLayout,
        lock: &Lock,
    ) -> Result<Option<&'static str>, String> {
        let Some(j) = self.journal(set).await? else {
            return Ok(None);
        };
        let recs = self.records(set).await?;
        let cur = &recs.current;
        let state = if j.failover {
            PrimaryState::Fenced
        } else {
            PrimaryState::Paused
        };
        if cur.generation != j.generation || cur.state != state {
            // Never paused (the driver died before), or already published, or superseded
            // by a failover: nothing of it is left to do.
            let mut client = self.client.clone();
            let held = (lock.key.as_str(), lock.lease);
            if !primaries::delete_if_locked(&mut client, self.journal_key(set), held)
                .await
                .map_err(|e| format!("etcd: {e}"))?
            {
                return Err("this host lost the set's switch lock".into());
            }
            return Ok(Some("dropped (nothing left to do)"));
        }
        tracing::warn!(shards = ?set.shards, from = %j.from, to = %j.to, generation = j.generation, step = ?j.step, driver = %j.driver, "settling a switch whose driver stopped");
        // A statement the stopped driver had already sent may still be running on a
        // server (every step is bounded by `step_bound`): wait it out before changing the
        // same servers, so that its late effect cannot land after this settle's.
        tokio::time::sleep(self.step_bound()).await;
        let recs = self.records(set).await?;
        if recs.current.generation != j.generation || recs.current.state != state {
            return Ok(Some("dropped (settled meanwhile)"));
        }
        match j.step {
            Step::Pausing | Step::ReadOnly => {
                self.undo(set, &j.from, &recs, lock).await;
                Ok(Some("undone"))
            }
            Step::Fencing => {
                undo_failover(self, set, &recs, true, lock).await;
                Ok(Some("undone"))
            }
            Step::Promoting if j.failover => {
                complete_failover(self, set, &recs, &j, lock, None).await?;
                Ok(Some("finished"))
            }
            Step::Promoting => {
                let admin = self.admin(&j.to);
                let mut to_c = srv::Kept::open(&admin).await;
                let problems = self.complete(set, &recs, &j, lock, false, &mut to_c).await;
                to_c.close().await;
                let problems = problems?;
                if !problems.is_empty() {
                    tracing::warn!(shards = ?set.shards, problems = ?problems, "settled switch finished with problems");
                }
                Ok(Some("finished"))
            }
        }
    }

    /// Settles the journals of the sets this host leads whose records are paused or
    /// fenced, when their lock is free (their driver stopped). Called every second by
    /// the monitor.
    pub async fn settle_led(&self) {
        let view = self.views.borrow().clone();
        for set in &self.layout.sets {
            let led = view.owners.get(&set.shards[0]) == Some(&self.host_id);
            let switching = view
                .primaries
                .get(&set.shards[0])
                .is_some_and(|r| r.state != PrimaryState::Serving);
            if !(led && switching) {
                continue;
            }
            let r = self
                .locked(set, |lock| async move { self.settle(set, &lock).await })
                .await;
            match r {
                Ok(Some(done)) => {
                    tracing::warn!(shards = ?set.shards, done, "switch settled by the next driver")
                }
                Ok(None) => {}
                // Its driver still holds the lock.
                Err(e) if e.starts_with("another switch") => {}
                Err(e) => {
                    tracing::warn!(shards = ?set.shards, error = %e, "cannot settle the switch yet")
                }
            }
        }
    }
}

/// A failover that promotes nobody: the replicas receive again, the old primary is
/// writable again if `fenced` (the fence reached it: it answers), and the shards stay on
/// it (failing while it does not answer) until it answers or an operator forces a
/// promotion; the journal ends.
pub(super) async fn undo_failover(
    d: &Driver,
    set: &SetLayout,
    recs: &SetRecords,
    fenced: bool,
    lock: &Lock,
) {
    let from = &recs.current.addr;
    let others = set.servers.iter().filter(|s| &s.addr != from);
    futures::future::join_all(others.map(|s| async move {
        let _ = d
            .admin(&s.addr)
            .exec(Duration::from_secs(2), "START SLAVE IO_THREAD")
            .await;
    }))
    .await;
    if fenced {
        let _ = d
            .admin(from)
            .with(Duration::from_secs(2), |c| {
                Box::pin(srv::set_read_only(c, false))
            })
            .await;
    }
    if let Err(e) = d.serve_again(set, recs, lock).await {
        tracing::error!(error = %e, "failover undo: cannot serve the shards again");
    }
}

/// The rest of a failover whose new primary `j.to` applied what it received (`recs`:
/// the fenced records): promoted (unless `promoted`, with the semi-sync setting it was
/// promoted with; promoting is idempotent), the others but the old primary repointed,
/// the old primary marked demoted, the shards served on the new one, the journal ended.
/// Returns what went wrong without stopping it.
pub(super) async fn complete_failover(
    d: &Driver,
    set: &SetLayout,
    recs: &SetRecords,
    j: &Journal,
    lock: &Lock,
    promoted: Option<bool>,
) -> Result<Vec<String>, String> {
    let (from, to, g) = (&j.from, &j.to, j.generation);
    let semi = match promoted {
        Some(semi) => semi,
        // Settled by another driver: semi-sync as configured (a replica that can
        // acknowledge is repointed to it below; with none, writes wait for
        // `rpl_semi_sync_master_timeout` and then go on without).
        None => {
            let semi = d.cfg.semi_sync;
            d.admin(to)
                .with(Duration::from_secs(3), |c| Box::pin(srv::promote(c, semi)))
                .await
                .map_err(|e| format!("cannot promote {to}: {e}"))?;
            semi
        }
    };
    let mut problems = d.repoint(set, to, Some(from), semi).await;
    let demoted = Demoted {
        primary: to.clone(),
        generation: g,
    };
    if let Err(e) = d.put_demoted(from, &demoted).await {
        problems.push(format!("cannot mark {from} demoted: {e}"));
    }
    d.serve_target(set, recs, j, lock).await?;
    Ok(problems)
}
