//! The planned switch of a replica set (switchover, and each set of a region drain):
//! pause, read-only, catch-up, promotion, repointing, publication; every failed step
//! undone (see the module docs of `crate::replication`).

use std::time::{Duration, Instant};

use futures::stream::StreamExt;

use super::driver::{servers, Driver, Lock, SetRecords, SERVED_WAIT};
use super::journal::{Journal, Step};
use super::server::{self as srv};
use super::{Refused, ReplicaState, SetLayout, SwitchReport, Switched};
use crate::model::{PrimaryRecord, PrimaryState};

/// How close the target must come before the old primary turns read-only: what it
/// applies in this long at its recent rate (see [`Driver::approach`]) ...
const APPROACH_WINDOW_MS: f64 = 30.0;
/// ... and never fewer, nor more, transactions than these.
const APPROACH_TX: (i64, i64) = (2, 64);
const APPROACH_POLL: Duration = Duration::from_millis(5);
/// A switch's last steps (promote, repoint, publish, served) taking this long are logged
/// with where the time went.
const SLOW_COMPLETE: Duration = Duration::from_millis(250);
/// A target that did not come that close within the approach's bound is switched only
/// when what it is behind would take it at most this long at the rate it applies; a
/// slower one (a starved SQL thread) is refused before anything is paused, rather than
/// holding the set read-only through its lag.
const STARVED_CATCHUP_MAX_MS: f64 = 150.0;

/// How far a target stayed behind the primary through the approach.
struct Behind {
    transactions: i64,
    allowed: i64,
    /// Transactions a millisecond it applied (smoothed).
    per_ms: f64,
}

impl Behind {
    /// How long the target would take to apply what it is behind, at its rate.
    fn catchup_ms(&self) -> f64 {
        if self.per_ms > 0.0 {
            self.transactions as f64 / self.per_ms
        } else {
            f64::INFINITY
        }
    }
}

impl Driver {
    /// The planned switch of `set` to `target` (None: the most caught-up replica, in
    /// `region` when given, else outside the current primary's region).
    pub(super) async fn switch(
        &self,
        set: &SetLayout,
        target: Option<String>,
        region: Option<String>,
    ) -> SwitchReport {
        let mut report = SwitchReport {
            kind: "switchover".into(),
            shards: set.shards.clone(),
            ..Default::default()
        };
        let r = self
            .locked(set, |lock| {
                self.switch_locked(set, target, region, &mut report, lock)
            })
            .await;
        self.finish(report, r)
    }

    /// The report of a switch that ended with `r`, counted.
    pub(super) fn finish(&self, mut report: SwitchReport, r: Result<(), String>) -> SwitchReport {
        if let Err(e) = r {
            report.ok = false;
            report.error = Some(e);
        }
        self.count(&report);
        report
    }

    async fn switch_locked(
        &self,
        set: &SetLayout,
        target: Option<String>,
        region: Option<String>,
        report: &mut SwitchReport,
        lock: Lock,
    ) -> Result<(), String> {
        // A switch of this set that its driver left half done: finished or undone first.
        if let Some(done) = self.settle(set, &lock).await? {
            tracing::warn!(shards = ?set.shards, done, "switch settled before the next one");
        }
        let recs = self.records(set).await?;
        let from = recs.current.addr.clone();
        report.from = from.clone();
        report.generation = recs.current.generation;
        if recs.current.state != PrimaryState::Serving {
            return Err(format!("shards {:?} are paused at generation {} (a switch did not finish); fail them over to settle them", set.shards, recs.current.generation));
        }
        let from_region = set.region_of(&from).unwrap_or_default().to_string();
        // The target: named, or the most caught-up eligible replica.
        let mut candidates = Vec::new();
        for s in set.servers.iter().filter(|s| s.addr != from) {
            let named = target
                .as_deref()
                .map(|t| super::server_addr(t).unwrap_or_else(|| t.to_string()));
            let eligible = match (&named, &region) {
                (Some(t), _) => *t == s.addr,
                (None, Some(r)) => s.region == *r,
                (None, None) => s.region != from_region,
            };
            if eligible {
                candidates.push(self.lag(set, &from, &s.addr).await);
            }
        }
        if candidates.is_empty() {
            return Err(match (&target, &region) {
                (Some(t), _) => format!(
                    "{t} is not a replica of shards {:?} (servers: {})",
                    set.shards,
                    servers(set)
                ),
                (None, Some(r)) => {
                    format!("shards {:?} have no replica in region {r:?}", set.shards)
                }
                (None, None) => format!(
                    "shards {:?} have no replica outside region {from_region:?}",
                    set.shards
                ),
            });
        }
        let lag_max = self.cfg.lag_max_ms as i64;
        let ready = |c: &ReplicaState| {
            c.reachable && c.io_running && c.sql_running && c.lag_ms.is_some_and(|l| l <= lag_max)
        };
        candidates.sort_by_key(|c| (!ready(c), c.lag_transactions.unwrap_or(i64::MAX)));
        let t = candidates.remove(0);
        if !ready(&t) {
            return Err(format!(
                "target {} is not ready: reachable {}, replicating {}/{}, lag {:?} ms (at most {lag_max}) {}",
                t.addr, t.reachable, t.io_running, t.sql_running, t.lag_ms, t.error
            ));
        }
        let to = t.addr.clone();
        report.to = to.clone();
        report.to_region = t.region.clone();
        // 0. Catch the target up while the old primary still serves, so that the read-only
        // window below holds the apply of a few transactions, not the target's lag.
        // A target that cannot close the distance while the primary takes writes (a
        // starved SQL thread) within half the catch-up bound is switched only when the
        // rest would take it at most STARVED_CATCHUP_MAX_MS; else the switch is refused
        // here, before anything changed (asked again, it may find the target closer).
        let within = Duration::from_millis(self.cfg.catchup_timeout_ms / 2);
        match self.approach(&from, &to, within).await {
            Ok(Ok((ms, behind))) => {
                tracing::info!(shards = ?set.shards, to, approach_ms = ms, behind, "target caught up before the switch");
            }
            Ok(Err(b)) if b.catchup_ms() <= STARVED_CATCHUP_MAX_MS => {
                tracing::info!(shards = ?set.shards, to, behind = b.transactions, catchup_ms = b.catchup_ms(), "switching a target still a few milliseconds of apply behind");
            }
            Ok(Err(b)) => {
                return Err(format!(
                    "target {to} is not ready: it stayed {} transactions behind {from} for \
                     {within:?} (at most {} to switch) and applies {:.1} a second, so its \
                     catch-up would hold the set read-only about {:.0} ms (at most \
                     {STARVED_CATCHUP_MAX_MS} ms); not switched, nothing was paused: ask again",
                    b.transactions,
                    b.allowed,
                    b.per_ms * 1000.0,
                    b.catchup_ms().min(1e9),
                ));
            }
            Err(e) => {
                tracing::warn!(shards = ?set.shards, error = %e, "switching a target whose distance could not be read")
            }
        }
        let g = recs.current.generation + 1;
        report.generation = g;
        // Each step below is journaled before it changes anything (see `journal`).
        let mut j = Journal {
            from: from.clone(),
            to: to.clone(),
            to_region: t.region.clone(),
            generation: g,
            step: Step::Pausing,
            driver: self.host_id.clone(),
            failover: false,
        };
        self.write_journal(set, &lock, &j).await?;
        // Connections to both servers, opened now and kept for the steps of the read-only
        // window below, which then pay no connect (a TLS handshake and a login) each.
        let (from_admin, to_admin) = (self.admin(&from), self.admin(&to));
        let (mut from_c, mut to_c) =
            tokio::join!(srv::Kept::open(&from_admin), srv::Kept::open(&to_admin));
        // 1. Pause: owners flush their buffers and stop the shards.
        let paused_at = Instant::now();
        let recs = self
            .publish(
                &recs,
                PrimaryRecord {
                    state: PrimaryState::Paused,
                    generation: g,
                    next_region: Some(t.region.clone()),
                    ..recs.current.clone()
                },
                &lock,
            )
            .await?;
        let pause_within = Duration::from_millis(self.cfg.pause_timeout_ms);
        // While the owners pause, the other replicas replicate from the target from now
        // on (see `chain`): at its promotion the new primary then already has replicas
        // that acknowledge its commits, and only the old primary is repointed inside the
        // read-only window. Orchestrator relocates replicas below a switch's target the
        // same way. Done after the journal says `pausing`, so that a switch stopped here
        // is undone, the replicas back below the old primary (see `undo`).
        let (chained, paused) = tokio::join!(
            self.chain(set, &from, &to),
            self.acks(&set.shards, "paused", g, pause_within)
        );
        if !chained.is_empty() {
            tracing::info!(shards = ?set.shards, to, problems = ?chained, "not every replica was chained below the target before the switch; repointed after the promotion");
        }
        if !paused {
            self.serve_again(set, &recs, &lock).await?;
            self.unchain(set, &from).await;
            return Err(format!(
                "the owners did not pause shards {:?} within {pause_within:?}; undone",
                set.shards
            ));
        }
        report.pause_ms = paused_at.elapsed().as_millis() as u64;
        crate::failpoint::pause("switch-paused").await;
        j.step = Step::ReadOnly;
        self.write_journal(set, &lock, &j).await?;
        // 2. The old primary read-only, and its last transaction.
        let bound = self.step_bound();
        let ro_at = Instant::now();
        let pos = from_c
            .step(bound, |c| {
                Box::pin(async move {
                    srv::set_read_only(c, true).await?;
                    srv::binlog_pos(c).await
                })
            })
            .await;
        let pos = match pos {
            Ok(p) => p,
            Err(e) => {
                self.undo(set, &from, &recs, &lock).await;
                return Err(format!(
                    "cannot make the old primary read-only: {e}; undone"
                ));
            }
        };
        crate::failpoint::pause("switch-read-only").await;
        // 3. The target applies it.
        let catchup = Duration::from_millis(self.cfg.catchup_timeout_ms);
        let caught = to_c
            .step(bound, |c| {
                let pos = pos.clone();
                Box::pin(async move { srv::wait_for(c, &pos, catchup).await })
            })
            .await;
        report.catchup_ms = ro_at.elapsed().as_millis() as u64;
        if caught != Ok(true) {
            self.undo(set, &from, &recs, &lock).await;
            return Err(format!(
                "{to} did not reach {pos} within {catchup:?} ({caught:?}); undone"
            ));
        }
        // From here on the switch is finished, by this driver or the next.
        j.step = Step::Promoting;
        self.write_journal(set, &lock, &j).await?;
        crate::failpoint::pause("switch-caught-up").await;
        let problems = self.complete(set, &recs, &j, &lock, true, &mut to_c).await;
        tokio::join!(from_c.close(), to_c.close());
        let problems = problems?;
        report.read_only_ms = ro_at.elapsed().as_millis() as u64;
        report.ok = true;
        if !problems.is_empty() {
            report.error = Some(problems.join("; "));
        }
        tracing::info!(shards = ?set.shards, from, to, generation = g, read_only_ms = report.read_only_ms, "switched replica set");
        Ok(())
    }

    /// The rest of a switch whose target has caught up with the read-only old primary
    /// (`recs`: the paused records): the target promoted (over `to_c`), the others
    /// repointed, the shards served on it, the journal ended. A promotion that fails is undone when
    /// `undo` (the driver that ran the steps before knows nothing was repointed yet);
    /// settling another driver's switch, it is an error, tried again at the next settle
    /// (the others may already replicate from the target: an undo would split the set).
    /// Returns what went wrong without stopping the switch.
    pub(super) async fn complete(
        &self,
        set: &SetLayout,
        recs: &SetRecords,
        j: &Journal,
        lock: &Lock,
        undo: bool,
        to_c: &mut srv::Kept<'_>,
    ) -> Result<Vec<String>, String> {
        let (from, to, g) = (&j.from, &j.to, j.generation);
        let bound = self.step_bound();
        let semi = self.cfg.semi_sync;
        let started = Instant::now();
        // 4. Promote it.
        if let Err(e) = to_c.step(bound, |c| Box::pin(srv::promote(c, semi))).await {
            if !undo {
                return Err(format!(
                    "cannot promote {to}: {e}; tried again at the next settle"
                ));
            }
            // Half promoted, maybe: back to a read-only replica of the old primary.
            let ch = self.cfg.channel();
            let old = from.clone();
            let back = self
                .admin(to)
                .with(bound, |c| {
                    Box::pin(async move { srv::follow(c, &old, &ch).await })
                })
                .await;
            self.undo(set, from, recs, lock).await;
            return Err(format!(
                "cannot promote {to}: {e}; undone (target back to a replica: {back:?})"
            ));
        }
        let promoted = started.elapsed();
        // 5. Serve it once a replica acknowledges its commits (semi-sync waits for one
        // before a commit returns): those chained below it before the pause already do.
        // The others (the old primary among them) are repointed meanwhile.
        let repoint = self.repoint(set, to, None, false);
        let serve = async {
            let unacknowledged = if semi {
                self.semi_ready(to_c, to).await
            } else {
                None
            };
            let replicated = started.elapsed();
            crate::failpoint::pause("switch-promoted").await;
            self.serve_target(set, recs, j, lock).await?;
            let published = started.elapsed();
            let served = self.acks(&set.shards, "served", g, SERVED_WAIT).await;
            Ok::<_, String>((unacknowledged, replicated, published, served))
        };
        let (mut problems, served) = tokio::join!(repoint, serve);
        let (unacknowledged, replicated, published, served) = served?;
        problems.extend(unacknowledged);
        if !served {
            problems.push(format!("not every shard was served within {SERVED_WAIT:?}"));
        }
        // Where a long read-only window went, for the operator (the window itself is in
        // the switch's report).
        let ms = |d: Duration| d.as_millis() as u64;
        let total = started.elapsed();
        let (promote_ms, replicas_ms, publish_ms, served_ms) = (
            ms(promoted),
            ms(replicated - promoted),
            ms(published - replicated),
            ms(total - published),
        );
        if total >= SLOW_COMPLETE {
            tracing::warn!(shards = ?set.shards, to, promote_ms, replicas_ms, publish_ms, served_ms, "a switch's last steps were slow");
        } else {
            tracing::info!(shards = ?set.shards, to, promote_ms, replicas_ms, publish_ms, served_ms, "a switch's last steps");
        }
        Ok(problems)
    }

    /// Waits, at most `within`, until `to` has applied all but a few of `from`'s
    /// transactions (domain 0): at most what it applies in [`APPROACH_WINDOW_MS`] at the
    /// rate it was seen applying, within [`APPROACH_TX`]. Returns how long that took and
    /// how far behind it was then, or how far it stayed ([`Behind`]); an error says why
    /// it cannot tell. Vitess's PlannedReparentShard also waits for its target, but after
    /// demoting the primary; here the primary still serves, so the wait costs clients
    /// nothing.
    async fn approach(
        &self,
        from: &str,
        to: &str,
        within: Duration,
    ) -> Result<Result<(u64, i64), Behind>, String> {
        let started = Instant::now();
        let bound = self.step_bound();
        let mut seen: Option<(Instant, u64)> = None;
        let mut per_ms = 0.0f64;
        loop {
            let primary = self
                .admin(from)
                .with(bound, |c| Box::pin(srv::binlog_pos(c)))
                .await
                .map_err(|e| format!("cannot read {from}'s position: {e}"))?;
            let applied = self
                .admin(to)
                .with(bound, |c| Box::pin(srv::slave_pos(c)))
                .await
                .map_err(|e| format!("cannot read {to}'s position: {e}"))?;
            let (Some(p), Some(a)) = (srv::seq_of(&primary, 0), srv::seq_of(&applied, 0)) else {
                // No transaction of domain 0 yet on one side: nothing to wait for.
                return Ok(Ok((started.elapsed().as_millis() as u64, 0)));
            };
            let now = Instant::now();
            if let Some((t, was)) = seen {
                let ms = now.duration_since(t).as_secs_f64() * 1000.0;
                if ms > 0.0 && a >= was {
                    // A smoothed apply rate: a pause of the target's SQL thread does not
                    // zero it at once.
                    per_ms = 0.5 * per_ms + 0.5 * (a - was) as f64 / ms;
                }
            }
            seen = Some((now, a));
            let behind = p as i64 - a as i64;
            let allowed =
                ((per_ms * APPROACH_WINDOW_MS) as i64).clamp(APPROACH_TX.0, APPROACH_TX.1);
            if behind <= allowed {
                return Ok(Ok((started.elapsed().as_millis() as u64, behind)));
            }
            if started.elapsed() >= within {
                return Ok(Err(Behind {
                    transactions: behind,
                    allowed,
                    per_ms,
                }));
            }
            tokio::time::sleep(APPROACH_POLL).await;
        }
    }

    /// After a failed switch step: the old primary writable again, the shards served on
    /// it, the journal ended.
    pub(super) async fn undo(&self, set: &SetLayout, from: &str, recs: &SetRecords, lock: &Lock) {
        let r = self
            .admin(from)
            .with(self.step_bound(), |c| {
                Box::pin(srv::set_read_only(c, false))
            })
            .await;
        if let Err(e) = r {
            tracing::error!(server = from, error = %e, "switch undo: cannot make the old primary writable again");
        }
        if let Err(e) = self.serve_again(set, recs, lock).await {
            tracing::error!(error = %e, "switch undo: cannot serve the shards again");
        }
        self.unchain(set, from).await;
    }

    pub(super) async fn drain_all(&self, from: String, to: Option<String>) -> Switched {
        if to.as_ref() == Some(&from) {
            return Err(Refused::Invalid(
                "a drain moves primaries to another region".into(),
            ));
        }
        let known = |r: &str| {
            self.layout
                .sets
                .iter()
                .any(|s| s.servers.iter().any(|x| x.region == r))
        };
        for r in std::iter::once(&from).chain(&to) {
            if !known(r) {
                return Err(Refused::Invalid(format!(
                    "no server of a replicated shard is in region {r:?}"
                )));
            }
        }
        let mut sets = Vec::new();
        for (i, set) in self.layout.sets.iter().enumerate() {
            let recs = self.records(set).await.map_err(Refused::Unavailable)?;
            if recs.current.region == from {
                sets.push(i);
            }
        }
        let reports = futures::stream::iter(sets)
            .map(|i| self.switch(&self.layout.sets[i], None, to.clone()))
            .buffer_unordered(self.cfg.drain_parallel_max)
            .collect::<Vec<_>>()
            .await;
        Ok(reports)
    }
}
