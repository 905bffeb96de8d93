//! Unplanned failover, and the monitor that calls for it: the host owning a replica set's
//! lowest shard writes the set's heartbeat row on its primary every
//! `replication.probe_interval_ms`; a primary that has not answered for
//! `replication.failover_after_ms` is replaced. A primary failed over while it did not
//! answer is marked demoted, and made read-only and repointed once it answers again.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql_async::prelude::*;
use tokio::sync::watch;

use super::driver::{Driver, Lock};
use super::journal::{self, Journal, Step};
use super::server::{self as srv};
use super::{SetLayout, SwitchReport};
use crate::cluster::primaries;
use crate::model::{PrimaryRecord, PrimaryState};

/// How long the fence (the old primary read-only, foqsd's connections ended) may take.
const FENCE_BOUND: Duration = Duration::from_millis(500);
/// How long a failover waits for the fence after the candidates answered: a primary that
/// answers at all is fenced by then; a silent one is not waited for.
const FENCE_GRACE: Duration = Duration::from_millis(100);

/// How long a failover waits for a candidate's IO thread to stop before reading what it
/// received anyway, when it is not connected (see [`ask`]).
const STOP_WAIT: Duration = Duration::from_millis(250);
/// How long a new primary's IO thread may take to stop before its replication settings
/// are dropped (see `srv::forget_primary`).
const FORGET_BOUND: Duration = Duration::from_secs(10);

/// One candidate for promotion, as it answered.
struct Candidate {
    addr: String,
    region: String,
    received: u64,
    io_pos: String,
    semi_sync: bool,
}

impl Driver {
    pub(super) async fn failover_set(&self, set: &SetLayout, allow_loss: bool) -> SwitchReport {
        let mut report = SwitchReport {
            kind: "failover".into(),
            shards: set.shards.clone(),
            ..Default::default()
        };
        let rep = &mut report;
        let r = self
            .locked(set, |lock| async move {
                // A planned switch its driver left: settled first (a failover from a
                // paused set whose target was promoted would find no candidate).
                if let Err(e) = self.settle(set, &lock).await {
                    tracing::warn!(shards = ?set.shards, error = %e, "failover: the switch under way cannot be settled; failing over anyway");
                }
                failover(self, set, allow_loss, rep, &lock).await
            })
            .await;
        self.finish(report, r)
    }
}

/// Replaces the primary of `set` (it is not answering, or an operator says so).
pub(super) async fn failover(
    d: &Driver,
    set: &SetLayout,
    allow_loss: bool,
    report: &mut SwitchReport,
    lock: &Lock,
) -> Result<(), String> {
    let recs = d.records(set).await?;
    let from = recs.current.addr.clone();
    report.from = from.clone();
    let g = recs.current.generation + 1;
    report.generation = g;
    // Journaled, so that the next driver undoes or finishes it (see `journal`).
    let mut j = Journal {
        from: from.clone(),
        to: String::new(),
        to_region: String::new(),
        generation: g,
        step: Step::Fencing,
        driver: d.host_id.clone(),
        failover: true,
    };
    d.write_journal(set, lock, &j).await?;
    // 1. Fenced by the generation: no host serves the shards on `from` from now on.
    let started = Instant::now();
    let fenced_record = PrimaryRecord {
        state: PrimaryState::Fenced,
        generation: g,
        next_region: None,
        ..recs.current.clone()
    };
    let recs = d.publish(&recs, fenced_record, lock).await?;
    // And on the server itself when it answers at all: read-only, foqsd's connections
    // ended.
    let user = d.data_user.clone();
    let old = d.admin(&from);
    let (fence_tx, mut fence_rx) = tokio::sync::watch::channel(None::<bool>);
    let fence = async move {
        let r = old
            .with(FENCE_BOUND, |c| {
                Box::pin(async move {
                    srv::set_read_only(c, true).await?;
                    srv::kill_user(c, &user).await
                })
            })
            .await;
        let _ = fence_tx.send(Some(r.is_ok()));
    };
    // 2. The candidates: each stops receiving first, then says what it received (a
    // position read while it still receives could miss a commit it acknowledged next).
    let others = set.servers.iter().filter(|s| s.addr != from);
    let asked = futures::future::join_all(others.map(|s| async move {
        let (r, stopping) = ask(d, &s.addr).await;
        (s, r, stopping)
    }));
    // The fence runs on its own: a primary that answers is fenced within the candidates'
    // round trip (waited for, a little longer); one that does not (frozen) is not waited
    // for, as nothing it could still commit is acknowledged: its replicas stopped
    // receiving, and its owners stop at the fenced record.
    tokio::spawn(fence);
    let asked = asked.await;
    let _ = tokio::time::timeout(FENCE_GRACE, fence_rx.wait_for(Option::is_some)).await;
    crate::failpoint::pause("failover-fenced").await;
    let mut steps = vec![("fence_and_candidates", started.elapsed().as_millis() as u64)];
    let mut answered = Vec::new();
    let mut silent = Vec::new();
    let mut idle = Vec::new();
    let mut stops = Vec::new();
    for (s, r, stopping) in asked {
        stops.push(stopping);
        match r {
            Ok((Some(st), semi)) => answered.push(Candidate {
                addr: s.addr.clone(),
                region: s.region.clone(),
                received: srv::seq_of(&st.io_pos, 0)
                    .unwrap_or(0)
                    .max(srv::seq_of(&st.slave_pos, 0).unwrap_or(0)),
                io_pos: if st.io_pos.is_empty() {
                    st.slave_pos
                } else {
                    st.io_pos
                },
                semi_sync: semi.replica_enabled,
            }),
            // Answers but replicates from nobody (a demoted primary not rejoined yet):
            // it acknowledged nothing of this primary's, and is no candidate.
            Ok((None, _)) => idle.push(s.addr.clone()),
            Err(e) => silent.push(e),
        }
    }
    let most = answered.iter().map(|c| c.received).max().unwrap_or(0);
    let best_semi = answered
        .iter()
        .filter(|c| c.semi_sync)
        .max_by_key(|c| c.received);
    // Whether the fence reached it: known for sure only once the fence ended (its bound).
    let fence_held = || {
        let mut rx = fence_rx.clone();
        async move {
            let r = tokio::time::timeout(FENCE_BOUND * 2, rx.wait_for(Option::is_some)).await;
            matches!(r, Ok(Ok(v)) if *v == Some(true))
        }
    };
    let refuse = |why: String| {
        let recs = &recs;
        let fence_held = fence_held();
        let stops = stops.clone();
        async move {
            for mut s in stops {
                let _ =
                    tokio::time::timeout(Duration::from_secs(6), s.wait_for(Option::is_some)).await;
            }
            journal::undo_failover(d, set, recs, fence_held.await, lock).await;
            Err(why)
        }
    };
    if !idle.is_empty() {
        steps.push(("idle_servers", idle.len() as u64));
    }
    // A primary last seen not waiting for acknowledgements may have acknowledged
    // commits no replica has.
    let async_primary =
        d.semi_seen.lock().expect("not poisoned").get(&from) == Some(&false) || !d.cfg.semi_sync;
    if async_primary && !allow_loss {
        return refuse(format!(
            "{from} was running without semi-sync acknowledgements: a replica may lack acknowledged transactions; --allow-loss promotes the most advanced one anyway"
        ))
        .await;
    }
    let chosen = match best_semi {
        Some(c) if silent.is_empty() || allow_loss => c,
        Some(_) => {
            return refuse(format!(
                "not every replica answered ({}): one of them may hold acknowledged transactions the others lack; --allow-loss promotes the best of the rest",
                silent.join("; ")
            ))
            .await
        }
        None if allow_loss && !answered.is_empty() => answered.iter().max_by_key(|c| c.received).expect("non-empty"),
        None => {
            return refuse(format!(
                "no semi-synchronous replica answered ({}): an asynchronous one may lack acknowledged transactions; --allow-loss promotes it anyway",
                silent.join("; ")
            ))
            .await
        }
    };
    report.lost_transactions = most.saturating_sub(chosen.received);
    report.to = chosen.addr.clone();
    report.to_region = chosen.region.clone();
    // The new primary waits for acknowledgements when a replica left can give them (with
    // none, waiting would stop every write until one comes back).
    let semi = d.cfg.semi_sync
        && answered
            .iter()
            .any(|c| c.semi_sync && c.addr != chosen.addr);
    // 3. It applies what it received, then becomes the primary.
    let catchup = Duration::from_millis(d.cfg.catchup_timeout_ms);
    let pos = chosen.io_pos.clone();
    let applied = d
        .admin(&chosen.addr)
        .with(catchup + Duration::from_secs(2), |c| {
            Box::pin(async move {
                srv::kill_io(c).await?;
                srv::wait_for(c, &pos, catchup).await
            })
        })
        .await;
    report.catchup_ms = started.elapsed().as_millis() as u64;
    if applied != Ok(true) && !allow_loss {
        return refuse(format!(
            "{} did not apply its relay log up to {} within {catchup:?} ({applied:?})",
            chosen.addr, chosen.io_pos
        ))
        .await;
    }
    // From here on the failover is finished, by this driver or the next.
    j.to = chosen.addr.clone();
    j.to_region = chosen.region.clone();
    j.step = Step::Promoting;
    d.write_journal(set, lock, &j).await?;
    crate::failpoint::pause("failover-caught-up").await;
    if let Err(e) = d
        .admin(&chosen.addr)
        .with(Duration::from_secs(3), |c| {
            Box::pin(srv::promote_now(c, semi))
        })
        .await
    {
        // Half promoted, maybe (its SQL thread stopped, writable): back to a read-only
        // replica of the old primary before the refusal lets the others receive again.
        let ch = d.cfg.channel();
        let old = from.clone();
        let back = d
            .admin(&chosen.addr)
            .with(Duration::from_secs(5), |c| {
                Box::pin(async move { srv::follow(c, &old, &ch).await })
            })
            .await;
        return refuse(format!(
            "cannot promote {}: {e} (back to a replica: {back:?})",
            chosen.addr
        ))
        .await;
    }
    // Its replication settings dropped once its IO thread stopped (not waited for).
    let forget = d.admin(&chosen.addr);
    let forgotten = chosen.addr.clone();
    tokio::spawn(async move {
        let r = forget
            .with(FORGET_BOUND, |c| Box::pin(srv::forget_primary(c)))
            .await;
        if let Err(e) = r {
            tracing::warn!(server = %forgotten, error = %e, "the new primary still has the old one's replication settings (its IO thread did not stop in time); they are dropped at its next promotion");
        }
    });
    steps.push(("promoted", started.elapsed().as_millis() as u64));
    let mut problems = journal::complete_failover(d, set, &recs, &j, lock, Some(semi)).await?;
    steps.push(("published", started.elapsed().as_millis() as u64));
    if !d.served(set, g).await {
        problems.push("not every shard was served on the new primary in time".into());
    }
    report.read_only_ms = started.elapsed().as_millis() as u64;
    report.ok = true;
    if *fence_rx.borrow() == Some(true) {
        problems.push(format!(
            "{from} answered the fence: it was made read-only and foqsd's connections to it ended"
        ));
    }
    if !problems.is_empty() {
        report.error = Some(problems.join("; "));
    }
    tracing::warn!(shards = ?set.shards, from, to = %chosen.addr, generation = g, outage_ms = report.read_only_ms, lost = report.lost_transactions, steps_ms = ?steps, notes = ?report.error, "failed over replica set");
    Ok(())
}

/// What a candidate received, once it stopped receiving: its replication status and its
/// semi-sync settings. Its IO thread is told to stop on a connection of its own; a
/// thread stuck connecting to a frozen primary takes about 2 s to end, and is not waited
/// for past [`STOP_WAIT`] when the status says it is not connected (it receives nothing
/// meanwhile, and does not start once told to stop). One still connected is waited for:
/// a position read while it receives could miss a commit it acknowledged next.
async fn ask(d: &Driver, addr: &str) -> (Asked, Stopping) {
    let admin = d.admin(addr);
    let stop = tokio::spawn(async move {
        admin
            .with(Duration::from_secs(5), |c| {
                Box::pin(async move {
                    if srv::replica_status(c).await?.is_some() {
                        srv::stop_io(c).await?;
                    }
                    Ok(())
                })
            })
            .await
    });
    let (tx, rx) = tokio::sync::watch::channel(None::<Result<(), String>>);
    tokio::spawn(async move {
        let r = stop.await.unwrap_or_else(|e| Err(e.to_string()));
        let _ = tx.send(Some(r));
    });
    let stopped = |mut rx: tokio::sync::watch::Receiver<Option<Result<(), String>>>, within| async move {
        match tokio::time::timeout(within, rx.wait_for(Option::is_some)).await {
            Ok(Ok(v)) => v.clone(),
            _ => None,
        }
    };
    let reader = d.admin(addr);
    let read = || {
        reader.with(Duration::from_secs(3), |c| {
            Box::pin(async move { Ok((srv::replica_status(c).await?, srv::semi_sync(c).await?)) })
        })
    };
    let early = stopped(rx.clone(), STOP_WAIT).await;
    let asked = async {
        let first = read().await?;
        let receiving = first.0.as_ref().is_some_and(|st| st.io_running);
        if matches!(early, Some(Ok(()))) || !receiving {
            return Ok(first);
        }
        match stopped(rx.clone(), Duration::from_secs(3)).await {
            Some(Ok(())) => read().await,
            Some(Err(e)) => Err(e),
            None => Err(format!("{addr}: its IO thread did not stop within 3 s")),
        }
    }
    .await;
    (asked, rx)
}

/// What a candidate answered (see [`ask`]).
type Asked = Result<(Option<srv::ReplicaStatus>, srv::SemiSync), String>;
/// The end of a candidate's stop, which may outlive [`ask`]: a refusal waits for it
/// before the candidate receives again (a `START SLAVE` while the stop runs does
/// nothing, and a stop that comes after it would stop the replica for good).
type Stopping = tokio::sync::watch::Receiver<Option<Result<(), String>>>;

/// The heartbeat connection of one set: the shards' account on the current primary.
struct Beat {
    addr: String,
    conn: Option<mysql_async::Conn>,
}

/// Writes the heartbeat row; true when the server answered (a refusal, such as
/// `read_only`, is an answer).
async fn beat(
    b: &mut Beat,
    (url, tls): (&str, Option<&crate::store::MysqlTls>),
    bound: Duration,
    now_ms: i64,
) -> bool {
    let run = async {
        if b.conn.is_none() {
            let opts = mysql_async::Opts::from_url(url)
                .map_err(|e| mysql_async::Error::Other(Box::new(e)))?;
            let opts = crate::store::with_tls(mysql_async::OptsBuilder::from_opts(opts), tls);
            let mut c = mysql_async::Conn::new(opts).await?;
            c.query_drop("CREATE TABLE IF NOT EXISTS foqs_heartbeat (id INT PRIMARY KEY, at_ms BIGINT NOT NULL)")
                .await?;
            b.conn = Some(c);
        }
        let c = b.conn.as_mut().expect("connected");
        c.exec_drop(
            "INSERT INTO foqs_heartbeat (id, at_ms) VALUES (0, ?) ON DUPLICATE KEY UPDATE at_ms = VALUES(at_ms)",
            (now_ms,),
        )
        .await
    };
    match tokio::time::timeout(bound, run).await {
        Ok(Ok(())) => true,
        Ok(Err(mysql_async::Error::Server(_))) => true,
        Ok(Err(_)) | Err(_) => {
            b.conn = None;
            false
        }
    }
}

/// The replica sets whose lowest shard this host owns (it leads them), with their
/// records, when they are served.
fn led(d: &Driver) -> Vec<(usize, PrimaryRecord)> {
    let view = d.views.borrow().clone();
    d.layout
        .sets
        .iter()
        .enumerate()
        .filter(|(_, set)| view.owners.get(&set.shards[0]) == Some(&d.host_id))
        .filter_map(|(i, set)| {
            let rec = view.primaries.get(&set.shards[0])?;
            (rec.state == PrimaryState::Serving).then(|| (i, rec.clone()))
        })
        .collect()
}

/// Runs until `stop`, for the replica sets this host leads: heartbeats and failure
/// detection every `probe_interval_ms`; beside them (so that a slow server does not
/// delay detection), every second, the gauges and the rejoin of demoted servers.
pub async fn run_monitor(d: Arc<Driver>, stop: watch::Receiver<bool>) {
    tokio::join!(detect(d.clone(), stop.clone()), housekeep(d, stop));
}

async fn detect(d: Arc<Driver>, mut stop: watch::Receiver<bool>) {
    let every = Duration::from_millis(d.cfg.probe_interval_ms);
    let after = Duration::from_millis(d.cfg.failover_after_ms);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Per set: when its primary last answered (silence is counted from there, not from
    // the first beat that went unanswered, which itself waits out its bound).
    let mut answered: HashMap<usize, Instant> = HashMap::new();
    // Per set: when its last beat was sent.
    let mut probed: HashMap<usize, Instant> = HashMap::new();
    let mut beats: HashMap<usize, Beat> = HashMap::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let led = led(&d);
        // Sets not led (any more): no connection of ours stays on their primaries.
        answered.retain(|i, _| led.iter().any(|(j, _)| j == i));
        probed.retain(|i, _| led.iter().any(|(j, _)| j == i));
        beats.retain(|i, _| led.iter().any(|(j, _)| j == i));
        for (i, rec) in led {
            let set = &d.layout.sets[i];
            let b = beats.entry(i).or_insert(Beat {
                addr: rec.addr.clone(),
                conn: None,
            });
            if b.addr != rec.addr {
                *b = Beat {
                    addr: rec.addr.clone(),
                    conn: None,
                };
            }
            let url = super::url_on(&set.heartbeat_url, &rec.addr);
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0);
            let sent = Instant::now();
            // Silence counts only across beats actually sent: after this loop was held
            // up for longer than `failover_after_ms` (a failover of another set runs in
            // it), the silence starts again at this beat.
            let held_up = probed
                .insert(i, sent)
                .is_some_and(|p| sent.duration_since(p) > after);
            if held_up {
                answered.insert(i, sent);
            }
            if beat(b, (&url, set.tls_of(&rec.addr)), every * 2, now_ms).await {
                answered.insert(i, sent);
                continue;
            }
            let since = *answered.entry(i).or_insert(sent);
            if since.elapsed() >= after {
                tracing::warn!(shards = ?set.shards, primary = %rec.addr, silent_ms = since.elapsed().as_millis() as u64, "primary does not answer; failing over");
                let r = d.failover_set(set, false).await;
                if !r.ok {
                    tracing::error!(shards = ?set.shards, error = ?r.error, "failover refused or failed; retrying while the primary is silent");
                }
                answered.remove(&i);
                b.conn = None;
            }
        }
    }
}

async fn housekeep(d: Arc<Driver>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut warned: BTreeSet<String> = BTreeSet::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        // Switches whose driver stopped mid-way, on the sets this host leads.
        d.settle_led().await;
        let led = led(&d);
        if led.is_empty() {
            continue;
        }
        for (i, rec) in &led {
            d.observe(&d.layout.sets[*i], &rec.addr).await;
        }
        let mut client = d.client.clone();
        let Ok(demoted) = primaries::demoted(&mut client, &d.prefix).await else {
            continue;
        };
        for (server, dem) in demoted {
            let Some((i, _)) = led
                .iter()
                .find(|(i, _)| d.layout.sets[*i].region_of(&server).is_some())
            else {
                continue;
            };
            let set = &d.layout.sets[*i];
            // Under the set's switch lock, against the primary etcd names now (a view
            // read before a failover made meanwhile would name the demoted server).
            let r = d
                .locked(set, |_lock| async {
                    let rec = d.records(set).await?.current;
                    if rec.state != PrimaryState::Serving {
                        return Err("a switch is under way".to_string());
                    }
                    if rec.addr == server {
                        // Promoted again since: nothing to rejoin.
                        let mut client = d.client.clone();
                        let _ = primaries::clear_demoted(&mut client, &d.prefix, &server).await;
                        return Ok(None);
                    }
                    rejoin(&d, &server, &rec.addr).await?;
                    let mut client = d.client.clone();
                    let _ = primaries::clear_demoted(&mut client, &d.prefix, &server).await;
                    Ok(Some(rec.addr))
                })
                .await;
            match r {
                Ok(Some(primary)) => {
                    tracing::info!(server, primary, generation = dem.generation, shards = ?set.shards, "demoted primary rejoined as a replica");
                    warned.remove(&server);
                }
                Ok(None) => {}
                Err(e) => {
                    if warned.insert(server.clone()) {
                        tracing::warn!(server, error = %e, "demoted primary cannot rejoin yet");
                    }
                }
            }
        }
    }
}

/// Makes a demoted primary read-only and, if its history is a prefix of `primary`'s,
/// a replica of it. Commits stuck on it waiting for an acknowledgement that will never
/// come (it was frozen mid-commit) are left alone until then: ending their connections
/// could let them commit; setting `read_only` waits for them and gives up, and no foqsd
/// writes the server meanwhile, as etcd names another primary.
async fn rejoin(d: &Driver, server: &str, primary: &str) -> Result<(), String> {
    let old = d
        .admin(server)
        .with(Duration::from_secs(3), |c| {
            Box::pin(async move {
                let _ = srv::set_read_only(c, true).await;
                srv::binlog_state_of(c).await
            })
        })
        .await?;
    let new = d
        .admin(primary)
        .with(Duration::from_secs(2), |c| {
            Box::pin(srv::binlog_state_of(c))
        })
        .await?;
    let errant = srv::errant(&old, &new);
    if !errant.is_empty() {
        return Err(format!(
            "it holds transactions up to {} that {primary} lacks (never acknowledged to a client): restart it as a replica (scripts/replicas.sh rejoin; init_rpl_role = SLAVE drops them) and it rejoins by itself",
            errant.join(",")
        ));
    }
    let ch = d.cfg.channel();
    let (primary, user) = (primary.to_string(), d.data_user.clone());
    d.admin(server)
        .with(Duration::from_secs(3), |c| {
            Box::pin(async move {
                srv::follow(c, &primary, &ch).await?;
                srv::kill_user(c, &user).await.map(|_| ())
            })
        })
        .await
}
