//! Following the shard manager: the shards this host serves, in line with each view
//! (opened, stopped, released), and a replicated shard only on the primary and
//! generation etcd names (see `crate::replication`).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use tokio::sync::{mpsc, watch};

use super::{ShardOpener, StartError};
use crate::cluster::{ClusterView, Report, ShardManager};
use crate::core::Host;
use crate::model::{PrimaryRecord, PrimaryState, ShardId};

/// Replicated shards: the generation and server each served shard was opened with, and
/// the shards this host owns but does not serve (paused for a switch, or failing to open).
#[derive(Default)]
pub(super) struct Replicated {
    /// The generation and server each served replicated shard was opened with.
    generation: HashMap<ShardId, (u64, String)>,
    unserved: BTreeSet<ShardId>,
    /// (shard, generation) pauses already reported.
    paused: BTreeSet<(ShardId, u64)>,
    /// Shards whose workers the host holds for a switch (see `Host::hold_shard`), with
    /// the generation of the pause they were held at.
    held: HashMap<ShardId, u64>,
}

impl Replicated {
    pub(super) fn forget_held(&mut self, id: ShardId) {
        self.held.remove(&id);
    }
}

/// How long stopping a shard whose primary was fenced (a failover) waits for the
/// worker's last writes to it: they cannot succeed, and the new primary waits for this
/// host to let the shard go.
const FENCED_STOP_MAX: Duration = Duration::from_millis(200);

/// How long a new owner's open of a shard paused for a switch may take (its count of the
/// shard's rows included) before it says the shard is paused anyway: the switch waits
/// for that ack (within `replication.pause_timeout_ms`), and a shard not opened by then
/// is opened as usual once served. Resumes of other sets' held workers run first.
const HELD_OPEN_MAX: Duration = Duration::from_millis(1000);

/// Brings the host's shards in line with the view: stops serving the shards it lost
/// (then tells the manager they are free) and opens the ones it gained. Returns the
/// shards that failed to open, to be retried.
pub(super) async fn follow_view(
    host: &Host,
    manager: &dyn ShardManager,
    opener: &ShardOpener,
    view: Arc<ClusterView>,
) -> Vec<(ShardId, StartError)> {
    host.set_view(view.clone());
    let owned: BTreeSet<ShardId> = view.shards_of(host.host_id()).into_iter().collect();
    let replicated = |s: &ShardId| opener.replicas_of(*s);
    // A replicated shard is served only while its primary is serving, and only on the
    // generation it was opened with: a switch stops it (and reopens it on the new primary).
    let serving = |s: &ShardId| match view.primaries.get(s) {
        Some(p) => p.state == PrimaryState::Serving,
        None => !replicated(s),
    };
    let mine: BTreeSet<ShardId> = owned.iter().copied().filter(serving).collect();
    // A worker held for a switch goes on only while its shard is still this host's and
    // its primary record is still the pause's generation (paused, or served after the
    // switch or its undo: the same rows either way). Anything else (the shard moved, a
    // failover fenced the set or served it at a later generation) stops it without
    // another write, before the shard is released or opened afresh.
    let held: Vec<(ShardId, u64)> = {
        let r = opener.replicated.lock().expect("not poisoned");
        r.held.iter().map(|(s, g)| (*s, *g)).collect()
    };
    for (s, g) in held {
        let keep = owned.contains(&s)
            && view.primaries.get(&s).is_some_and(|p| {
                p.generation == g && matches!(p.state, PrimaryState::Paused | PrimaryState::Serving)
            });
        if !keep {
            host.drop_held(s).await;
            opener.forget_held(s);
        }
    }
    let served: BTreeSet<ShardId> = host.shard_ids().into_iter().collect();
    let stale: BTreeSet<ShardId> = {
        let r = opener.replicated.lock().expect("not poisoned");
        served
            .iter()
            .copied()
            .filter(|s| {
                view.primaries
                    .get(s)
                    .is_some_and(|p| r.generation.get(s).map(|g| g.0) != Some(p.generation))
            })
            .collect()
    };
    let stop: BTreeSet<ShardId> = served.difference(&mine).chain(&stale).copied().collect();
    // Stopped without writing to its server: a failover fenced it, or the view moved the
    // shard to another server without this host seeing the fence (a failover it missed).
    let fenced: BTreeSet<ShardId> = {
        let r = opener.replicated.lock().expect("not poisoned");
        stop.iter()
            .copied()
            .filter(|s| {
                // Fenced, or naming another server than the one it was opened on (paused
                // or served: a failover this host missed), whose rows it does not know.
                view.primaries.get(s).is_some_and(|p| {
                    p.state == PrimaryState::Fenced
                        || r.generation.get(s).is_some_and(|(_, a)| *a != p.addr)
                })
            })
            .collect()
    };
    // Paused for a planned switch, still this host's, and served on the server the
    // pause names (a host that missed a failover knows another server's rows): held
    // rather than stopped, so that serving it on the new primary needs no reopen (see
    // `Host::hold_shard`).
    let holdable: HashMap<ShardId, u64> = {
        let r = opener.replicated.lock().expect("not poisoned");
        stop.iter()
            .filter(|s| owned.contains(s))
            .filter_map(|s| {
                let p = view.primaries.get(s)?;
                let on = r.generation.get(s).map(|(_, a)| a.as_str());
                (p.state == PrimaryState::Paused
                    && on == Some(p.addr.as_str())
                    && opener.movable(*s))
                .then_some((*s, p.generation))
            })
            .collect()
    };
    let fenced = &fenced;
    join_all(stop.iter().map(|&s| {
        let pause = holdable.get(&s).copied();
        async move {
            if fenced.contains(&s) {
                host.abandon_shard(s, FENCED_STOP_MAX).await
            } else if let Some(g) = pause {
                if host.hold_shard(s).await {
                    let mut r = opener.replicated.lock().expect("not poisoned");
                    r.held.insert(s, g);
                }
            } else {
                host.remove_shard(s).await
            }
            opener
                .replicated
                .lock()
                .expect("not poisoned")
                .generation
                .remove(&s);
        }
    }))
    .await;
    // Shards of this host paused for a switch, neither served nor held here: their
    // owner moved here at the pause (to the target's region). Opened now, on the old
    // primary (whose rows no host changes any more), and held before their first turn,
    // so that serving them on the new primary needs no reopen inside the read-only
    // window. One that fails to open is opened as usual once served.
    let to_hold: Vec<(ShardId, &PrimaryRecord)> = {
        let r = opener.replicated.lock().expect("not poisoned");
        let served = host.shard_ids();
        owned
            .iter()
            .filter(|s| !served.contains(s) && !r.held.contains_key(s))
            .filter_map(|s| {
                let p = view.primaries.get(s)?;
                (p.state == PrimaryState::Paused && opener.movable(*s)).then_some((*s, p))
            })
            .collect()
    };
    {
        // Shards this host let go of: released to their next owner (whether it served
        // them until now or held them unserved); shards it keeps unserved are remembered.
        let mut r = opener.replicated.lock().expect("not poisoned");
        let unserved: Vec<ShardId> = stop.iter().chain(&r.unserved).copied().collect();
        r.unserved.clear();
        for s in unserved {
            if owned.contains(&s) {
                r.unserved.insert(s);
            } else {
                manager.released(s);
            }
        }
        // Held but not served because its primary is not serving (fenced by a failover
        // under way, or paused): unserved, so that it is released should the view move
        // it before it is ever opened here. (Before: a shard acquired while fenced and
        // moved away by region affinity once the failover ended was never released,
        // and had no owner until this host restarted.)
        for s in owned.iter().filter(|s| !mine.contains(s)) {
            r.unserved.insert(*s);
        }
        // Withdrawn by the manager and neither served nor held for a switch here: taken
        // and moved on between two views this host saw, so never opened. Nothing to stop:
        // released now, or it would keep its key (and no owner) until this host left.
        let served = host.shard_ids();
        for s in &view.withdrawn {
            if !served.contains(s) && !r.held.contains_key(s) {
                manager.released(*s);
            }
        }
        // Paused for a switch: say so, once per generation (generations only rise: the
        // pauses of older ones are forgotten).
        r.paused
            .retain(|(s, g)| view.primaries.get(s).is_some_and(|p| p.generation <= *g));
        for s in &owned {
            if to_hold.iter().any(|(t, _)| t == s) {
                // Said once its worker is held, below.
                r.unserved.insert(*s);
                continue;
            }
            if let Some(p) = view.primaries.get(s) {
                if p.state == PrimaryState::Paused && r.paused.insert((*s, p.generation)) {
                    r.unserved.insert(*s);
                    manager.report(*s, p.generation, Report::Paused);
                }
            }
        }
    }
    // Held workers whose switch served their shard (on the new primary, or the old one
    // again after an undo) go on there; one whose store cannot move is opened afresh.
    let resumable: Vec<(ShardId, &PrimaryRecord)> = {
        let r = opener.replicated.lock().expect("not poisoned");
        mine.iter()
            .filter_map(|s| {
                let p = view.primaries.get(s)?;
                (r.held.get(s) == Some(&p.generation)).then_some((*s, p))
            })
            .collect()
    };
    let resumed = join_all(resumable.into_iter().map(|(s, p)| async move {
        opener.forget_held(s);
        let ok = match opener.retarget(s, p) {
            Some(to) => host.resume_shard(s, to).await,
            None => {
                host.drop_held(s).await;
                false
            }
        };
        (s, p, ok)
    }))
    .await;
    for (s, p, ok) in resumed {
        if ok {
            let mut rep = opener.replicated.lock().expect("not poisoned");
            rep.unserved.remove(&s);
            rep.generation.insert(s, (p.generation, p.addr.clone()));
            manager.report(s, p.generation, Report::Served);
        }
    }
    let prepared = join_all(to_hold.into_iter().map(|(s, p)| async move {
        let open = opener.open_held(s, host.unseen_leases(s), p);
        let r = tokio::time::timeout(HELD_OPEN_MAX, open).await;
        (s, p, r)
    }))
    .await;
    for (s, p, r) in prepared {
        match r {
            Ok(Ok((handle, worker, resume))) => {
                host.keep_held(handle, worker, resume);
                let mut r = opener.replicated.lock().expect("not poisoned");
                r.held.insert(s, p.generation);
            }
            Ok(Err(e)) => {
                tracing::info!(shard = s, error = %e, "cannot open a paused shard ahead of its switch; it is opened once served")
            }
            Err(_) => {
                tracing::info!(shard = s, bound = ?HELD_OPEN_MAX, "a paused shard's open ahead of its switch took too long; it is opened once served")
            }
        }
        // Paused here: said once its worker is held (or could not be opened), so that the
        // switch's read-only window does not begin before this host is ready to serve.
        let mut r = opener.replicated.lock().expect("not poisoned");
        if r.paused.insert((s, p.generation)) {
            manager.report(s, p.generation, Report::Paused);
        }
    }
    let served: BTreeSet<ShardId> = host.shard_ids().into_iter().collect();
    let opened = join_all(mine.difference(&served).map(|&s| {
        let primary = view.primaries.get(&s);
        async move {
            (
                s,
                primary,
                opener.open(s, host.unseen_leases(s), primary).await,
            )
        }
    }))
    .await;
    let mut failed = Vec::new();
    for (s, primary, r) in opened {
        match r {
            Ok((handle, worker)) => {
                host.add_shard(handle, worker);
                let mut rep = opener.replicated.lock().expect("not poisoned");
                rep.unserved.remove(&s);
                if let Some(p) = primary {
                    rep.generation.insert(s, (p.generation, p.addr.clone()));
                    manager.report(s, p.generation, Report::Served);
                }
            }
            Err(e) => {
                opener
                    .replicated
                    .lock()
                    .expect("not poisoned")
                    .unserved
                    .insert(s);
                failed.push((s, e));
            }
        }
    }
    failed
}

/// Follows the manager's views until `stop`; retries shards that failed to open, and
/// opens afresh a shard whose owner lock was lost or whose worker died.
pub(super) async fn follow(
    host: Arc<Host>,
    manager: Arc<dyn ShardManager>,
    opener: ShardOpener,
    mut views: watch::Receiver<Arc<ClusterView>>,
    mut lost: mpsc::UnboundedReceiver<ShardId>,
    mut stop: watch::Receiver<bool>,
) {
    let mut retry = false;
    loop {
        tokio::select! {
            r = views.changed() => if r.is_err() { break },
            _ = tokio::time::sleep(Duration::from_secs(1)), if retry => {}
            Some(shard) = lost.recv() => {
                // Whatever it kept in memory may be stale now (or its worker is gone):
                // stop it, open it anew. If the view has meanwhile given it to another
                // host, tell the manager it is free: nothing else would (follow_view
                // releases only shards it stops serving itself).
                host.remove_shard(shard).await;
                if !views.borrow().shards_of(host.host_id()).contains(&shard) {
                    manager.released(shard);
                }
            }
            _ = stop.changed() => break,
        }
        let view = views.borrow_and_update().clone();
        let failed = follow_view(&host, &*manager, &opener, view).await;
        for (s, e) in &failed {
            tracing::warn!(shard = s, error = %e, "cannot open shard; retrying");
        }
        retry = !failed.is_empty();
    }
}
