//! Test harness shared by the Rust integration tests: private databases on the real
//! MariaDB/MySQL, an in-process `foqsd` on 127.0.0.1:0 or the real binary, and a real
//! Thrift client (the generated one, over framed binary or compact protocol).
#![allow(dead_code)]

mod mariadb;
pub mod netns;
mod procs;
pub mod replicas;
pub mod shard;
#[allow(unused_imports)] // used by some tests only
pub use mariadb::PrivateMariaDb;
#[allow(unused_imports)]
pub use procs::{Etcd, Proc};

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use foqs::clock::SystemClock;
use foqs::config::Config;
use foqs::daemon::Running;
use foqs::thrift_gen::*;
use mysql_async::prelude::*;

/// Sends foqsd's own logs (info and up) to the test's captured output, so that a failing
/// test shows why the server closed a connection or refused a request; a passing test's
/// output is dropped as usual. Once per test binary; later calls do nothing.
pub fn logs_in_test_output() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("foqs=info"))
        .with_test_writer()
        .try_init();
}

/// The kernel's counters of connections its listen queues dropped (from
/// `/proc/net/netstat`), for a test's failure message: empty where there is no such file.
pub fn listen_counters() -> Vec<(String, u64)> {
    let text = std::fs::read_to_string("/proc/net/netstat").unwrap_or_default();
    let mut lines = text.lines().filter(|l| l.starts_with("TcpExt:"));
    let (Some(names), Some(values)) = (lines.next(), lines.next()) else {
        return Vec::new();
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .filter(|(n, _)| n.starts_with("Listen") || n.starts_with("Syncookies"))
        .filter_map(|(n, v)| Some((n.to_string(), v.parse().ok()?)))
        .collect()
}

/// The MySQL server tests use: `FOQS_TEST_MYSQL_URL`, else the local one.
pub fn mysql_base() -> String {
    std::env::var("FOQS_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".to_string())
}

/// The backend the tests that run on every backend use: `FOQS_TEST_BACKEND=sqlite` for
/// SQLite files, else MySQL.
pub fn sqlite_backend() -> bool {
    std::env::var("FOQS_TEST_BACKEND").is_ok_and(|b| b == "sqlite")
}

static NEXT_DB: AtomicUsize = AtomicUsize::new(0);

/// Databases of one test (MySQL databases, or SQLite files in a folder of their own),
/// dropped when it ends (even when it fails).
pub struct TestDb {
    pub base: String,
    pub names: Vec<String>,
    /// The folder of the SQLite files, on that backend.
    pub dir: Option<std::path::PathBuf>,
    /// The id of the first shard in configs (`shards_toml`); the others follow it.
    pub first_shard_id: usize,
}

impl TestDb {
    /// On the backend `FOQS_TEST_BACKEND` names.
    pub fn new(shards: usize) -> TestDb {
        Self::on(shards, sqlite_backend())
    }

    /// MySQL databases, whatever the backend (tests of MySQL-only behaviour).
    pub fn mysql(shards: usize) -> TestDb {
        Self::on(shards, false)
    }

    /// SQLite files, whatever the backend.
    pub fn sqlite(shards: usize) -> TestDb {
        Self::on(shards, true)
    }

    fn on(shards: usize, sqlite: bool) -> TestDb {
        let n = NEXT_DB.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        let names = (0..shards)
            .map(|i| format!("foqs_t{pid}_{n}_s{i}"))
            .collect();
        let dir = sqlite.then(|| std::env::temp_dir().join(format!("foqs-db-{pid}-{n}")));
        TestDb {
            base: mysql_base(),
            names,
            dir,
            first_shard_id: 0,
        }
    }

    /// Shard ids from `id` on: a test whose failpoints name a shard (`shard-N-turn`) takes
    /// ids no other test of its binary uses, since failpoints are shared by the process.
    pub fn with_first_shard_id(mut self, id: usize) -> TestDb {
        self.first_shard_id = id;
        self
    }

    pub fn is_sqlite(&self) -> bool {
        self.dir.is_some()
    }

    pub fn url(&self, shard: usize) -> String {
        match &self.dir {
            Some(dir) => format!("sqlite://{}/{}.db", dir.display(), self.names[shard]),
            None => format!("{}/{}", self.base, self.names[shard]),
        }
    }

    pub fn shards_toml(&self) -> String {
        (0..self.names.len())
            .map(|i| {
                let id = self.first_shard_id + i;
                format!("[[shards]]\nid = {id}\nurl = \"{}\"\n", self.url(i))
            })
            .collect()
    }

    /// Runs a query on one shard's database and returns the first column of every row.
    pub async fn column(&self, shard: usize, sql: &str) -> Vec<i64> {
        if let Some(dir) = &self.dir {
            // A second connection beside foqsd's (WAL mode lets it read).
            let path = dir.join(format!("{}.db", self.names[shard]));
            let conn = rusqlite::Connection::open(path).expect("open the shard's file");
            let sql = sql.replace(" AS SIGNED)", " AS INTEGER)");
            let mut st = conn.prepare(&sql).expect("query");
            return st
                .query_map([], |r| r.get::<_, i64>(0))
                .expect("query")
                .map(|v| v.expect("row"))
                .collect();
        }
        let mut conn = mysql_async::Conn::from_url(self.url(shard))
            .await
            .expect("connect");
        let v: Vec<i64> = conn.query(sql).await.expect("query");
        let _ = conn.disconnect().await;
        v
    }

    /// Runs statements (`;`-separated) on one shard's database.
    pub async fn exec(&self, shard: usize, sql: &str) {
        if let Some(dir) = &self.dir {
            let path = dir.join(format!("{}.db", self.names[shard]));
            let conn = rusqlite::Connection::open(path).expect("open the shard's file");
            conn.execute_batch(sql).expect("statements");
            return;
        }
        let mut conn = mysql_async::Conn::from_url(self.url(shard))
            .await
            .expect("connect");
        conn.query_drop(sql).await.expect("statements");
        let _ = conn.disconnect().await;
    }

    /// How many items are in `state` (and match `and`, SQL over the shared layout, when
    /// not empty), over all shards: the states by name, not by their stored numbers.
    pub async fn count_in(&self, state: foqs::model::ItemState, and: &str) -> i64 {
        let cond = format!("state = {}", state as i8);
        if and.is_empty() {
            self.count(&cond).await
        } else {
            self.count(&format!("{cond} AND {and}")).await
        }
    }

    /// `SELECT COUNT(*) ... WHERE <cond>` summed over all shards.
    pub async fn count(&self, cond: &str) -> i64 {
        let mut total = 0;
        for s in 0..self.names.len() {
            total += self
                .column(s, &format!("SELECT COUNT(*) FROM items WHERE {cond}"))
                .await[0];
        }
        total
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some(dir) = config_dir(self) {
            let _ = std::fs::remove_dir_all(dir);
        }
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
            return;
        }
        let base = self.base.clone();
        let names = self.names.clone();
        // Drop runs outside async code: use a private runtime on a plain thread.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                if let Ok(mut conn) = mysql_async::Conn::from_url(base).await {
                    for n in names {
                        let _ = conn
                            .query_drop(format!("DROP DATABASE IF EXISTS `{n}`"))
                            .await;
                    }
                    let _ = conn.disconnect().await;
                }
            })
        })
        .join();
    }
}

/// Engine settings that make background work visible within a test's patience.
pub const FAST_ENGINE: &str = "[engine]\nscan_interval_ms = 20\ncheckpoint_interval_ms = 100\n";

/// A config over `db`; `server_extra` lines go into `[server]`, `extra` after the shards.
pub fn config_toml(db: &TestDb, server_extra: &str, extra: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n{server_extra}\n{}\n{}",
        db.shards_toml(),
        extra
    )
}

/// An in-process foqsd over `db` (`extra` after the shards in its config) on `clock`, whose
/// shard 0's store meets the faults the test arms.
pub async fn foqsd_with_faults(
    db: &TestDb,
    extra: &str,
    clock: foqs::clock::SharedClock,
) -> (Running, foqs::store::faulty::Faults) {
    foqsd_with_faults_on(db, "", extra, clock).await
}

/// [`foqsd_with_faults`] with `server_extra` lines in its `[server]` section.
pub async fn foqsd_with_faults_on(
    db: &TestDb,
    server_extra: &str,
    extra: &str,
    clock: foqs::clock::SharedClock,
) -> (Running, foqs::store::faulty::Faults) {
    let cfg = Config::from_toml(&config_toml(db, server_extra, extra)).expect("test config");
    let faults = foqs::store::faulty::Faults::default();
    let plan = std::collections::BTreeMap::from([(0, faults.clone())]);
    let running = foqs::daemon::start_with_faults(&cfg, clock, plan)
        .await
        .expect("foqsd starts");
    (running, faults)
}

/// The folder of `db`'s config files: named after its first database, removed with it.
fn config_dir(db: &TestDb) -> Option<std::path::PathBuf> {
    let first = db.names.first()?;
    Some(std::env::temp_dir().join(format!("foqs-{}-{first}", std::process::id())))
}

/// Writes `toml` to a config file of its own (in [`config_dir`]).
pub fn write_config(db: &TestDb, toml: &str) -> std::path::PathBuf {
    let dir = config_dir(db).expect("a config names at least one shard");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("foqsd.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

/// An in-process foqsd over its own databases.
pub struct TestServer {
    pub running: Option<Running>,
    pub addr: SocketAddr,
    pub db: TestDb,
}

impl TestServer {
    pub async fn start(shards: usize, extra: &str) -> TestServer {
        Self::start_on(TestDb::new(shards), extra).await
    }

    pub async fn start_on(db: TestDb, extra: &str) -> TestServer {
        Self::start_full(db, "", extra).await
    }

    pub async fn start_full(db: TestDb, server_extra: &str, extra: &str) -> TestServer {
        Self::start_with_clock(db, server_extra, extra, Arc::new(SystemClock)).await
    }

    pub async fn start_with_clock(
        db: TestDb,
        server_extra: &str,
        extra: &str,
        clock: foqs::clock::SharedClock,
    ) -> TestServer {
        let extra = if extra.contains("[engine]") {
            extra.to_string()
        } else {
            format!("{FAST_ENGINE}{extra}")
        };
        let mut cfg =
            Config::from_toml(&config_toml(&db, server_extra, &extra)).expect("test config");
        // The payload cache is off by default; tests run foqsd with it on (MySQL's claims go
        // through it, SQLite keeps nothing), so that every suite over a foqsd exercises it,
        // unless a test sets it.
        if !extra.contains("payload_cache_bytes_max") {
            cfg.engine.payload_cache_bytes_max = 16 << 20;
        }
        let running = foqs::daemon::start(&cfg, clock)
            .await
            .expect("foqsd starts");
        TestServer {
            addr: running.addr,
            running: Some(running),
            db,
        }
    }

    pub fn client(&self) -> Client {
        Client::connect(self.addr, Proto::Binary)
    }

    pub async fn stop(mut self) -> TestDb {
        if let Some(r) = self.running.take() {
            r.shutdown().await;
        }
        self.db
    }
}

pub use foqs::client::Protocol as Proto;
use foqs::client::SyncClient;

/// The generated synchronous client; every call runs in `block_in_place`, so tests need
/// the multi-threaded runtime.
pub struct Client(SyncClient);

impl Client {
    pub fn connect(addr: SocketAddr, proto: Proto) -> Client {
        Client(foqs::client::connect(addr, proto, Duration::from_secs(20)).expect("connect"))
    }

    pub fn from_sync(c: SyncClient) -> Client {
        Client(c)
    }

    pub fn call<T>(
        &mut self,
        f: impl FnOnce(&mut SyncClient) -> thrift::Result<T>,
    ) -> thrift::Result<T> {
        tokio::task::block_in_place(|| f(&mut self.0))
    }

    pub fn try_enqueue(&mut self, items: Vec<EnqueueItem>) -> thrift::Result<Vec<EnqueueResult>> {
        self.call(|c| {
            c.enqueue(EnqueueRequest {
                forwarded_for: None,
                items: Some(items),
                forwarded_by: None,
                forward_token: None,
            })
        })
        .map(|r| r.results.unwrap())
    }

    /// Enqueues and insists that every item succeeded; returns the ids.
    pub fn enqueue(&mut self, items: Vec<EnqueueItem>) -> Vec<String> {
        self.try_enqueue(items)
            .expect("enqueue")
            .into_iter()
            .map(|r| {
                assert!(r.error.is_none(), "item failed: {:?}", r.error);
                r.id.expect("id")
            })
            .collect()
    }

    pub fn try_dequeue(&mut self, topics: Vec<TopicRequest>) -> thrift::Result<Vec<Item>> {
        self.try_dequeue_wait(topics, None)
    }

    /// A long poll when `wait_ms` is given.
    pub fn try_dequeue_wait(
        &mut self,
        topics: Vec<TopicRequest>,
        wait_ms: Option<i64>,
    ) -> thrift::Result<Vec<Item>> {
        self.call(|c| {
            c.dequeue(DequeueRequest {
                forwarded_for: None,
                topics: Some(topics),
                wait_ms,
                local_only: None,
                forwarded_by: None,
            })
        })
        .map(|r| r.items.unwrap())
    }

    pub fn dequeue(&mut self, ns: &str, topic: &str, count: i32) -> Vec<Item> {
        self.try_dequeue(vec![topic_req(ns, topic, count)])
            .expect("dequeue")
    }

    pub fn ack(&mut self, ids: &[String]) -> Vec<ItemResult> {
        self.call(|c| {
            c.ack(AckRequest {
                ids: Some(ids.to_vec()),
                forwarded_by: None,
                forwarded_for: None,
                lease_ids: None,
            })
        })
        .expect("ack")
        .results
        .unwrap()
    }

    pub fn nack(&mut self, items: Vec<NackItem>) -> Vec<ItemResult> {
        self.call(|c| {
            c.nack(NackRequest {
                items: Some(items),
                forwarded_by: None,
                forwarded_for: None,
                nack_token: None,
            })
        })
        .expect("nack")
        .results
        .unwrap()
    }

    pub fn try_topics(
        &mut self,
        ns: &str,
        limit: Option<i32>,
        after: Option<&str>,
    ) -> thrift::Result<GetActiveTopicsResponse> {
        let req = GetActiveTopicsRequest {
            forwarded_for: None,
            ns: Some(ns.into()),
            limit,
            after: after.map(str::to_string),
            local_only: None,
        };
        self.call(|c| c.get_active_topics(req))
    }

    /// (topic, ready, deferred, leased) of every active topic of `ns`.
    pub fn topics(&mut self, ns: &str) -> Vec<(String, i64, i64, i64)> {
        self.try_topics(ns, None, None)
            .expect("getActiveTopics")
            .topics
            .unwrap()
            .into_iter()
            .map(|t| {
                (
                    t.topic.unwrap(),
                    t.ready.unwrap(),
                    t.deferred.unwrap(),
                    t.leased.unwrap(),
                )
            })
            .collect()
    }

    pub fn touch(&mut self, items: &[(&str, i64)]) -> Vec<ItemResult> {
        let items = items
            .iter()
            .map(|(id, extend_ms)| TouchItem {
                id: Some(id.to_string()),
                extend_ms: Some(*extend_ms),
                lease_id: None,
            })
            .collect();
        self.call(|c| {
            c.touch(TouchRequest {
                items: Some(items),
                forwarded_by: None,
                forwarded_for: None,
            })
        })
        .expect("touch")
        .results
        .unwrap()
    }

    pub fn try_peek(&mut self, ns: &str, topic: &str, count: i32) -> thrift::Result<Vec<Item>> {
        let req = PeekRequest {
            forwarded_for: None,
            ns: Some(ns.into()),
            topic: Some(topic.into()),
            count: Some(count),
            local_only: None,
        };
        self.call(|c| c.peek(req)).map(|r| r.items.unwrap())
    }

    pub fn stats(&mut self, ns: &str, topic: &str) -> TopicStats {
        let req = TopicStatsRequest {
            forwarded_for: None,
            ns: Some(ns.into()),
            topic: Some(topic.into()),
            local_only: None,
        };
        self.call(|c| c.topic_stats(req)).expect("topicStats")
    }

    pub fn host_info(&mut self) -> HostInfo {
        self.call(|c| c.get_host_info()).expect("getHostInfo")
    }
}

/// A `notifyReady` entry: one ready item of `topic`, head at priority 0.
pub fn one_ready(ns: &str, topic: &str) -> foqs::thrift_gen::ReadyTopic {
    foqs::thrift_gen::ReadyTopic {
        ns: Some(ns.into()),
        topic: Some(topic.into()),
        ready: Some(1),
        head_priority: Some(0),
        head_deliver_after_ms: Some(0),
        heads: None,
    }
}

pub fn item(ns: &str, topic: &str, priority: i32, payload: &[u8]) -> EnqueueItem {
    foqs::client::new_item(ns, topic, priority, payload.to_vec())
}

/// A nack that sends the item to the dead letters.
pub fn to_dlq(id: &str) -> NackItem {
    NackItem {
        id: Some(id.into()),
        delay_ms: None,
        metadata: None,
        to_dlq: Some(true),
        lease_id: None,
    }
}

pub fn topic_req(ns: &str, topic: &str, count: i32) -> TopicRequest {
    TopicRequest {
        ns: Some(ns.into()),
        topic: Some(topic.into()),
        count: Some(count),
        before_priority: None,
        before_deliver_after_ms: None,
    }
}

pub fn nack(id: &str, delay_ms: Option<i64>, metadata: Option<&[u8]>) -> NackItem {
    NackItem {
        id: Some(id.into()),
        delay_ms,
        metadata: metadata.map(<[u8]>::to_vec),
        to_dlq: None,
        lease_id: None,
    }
}

/// The declared FoqsError inside a failed call.
pub fn foqs_error(e: thrift::Error) -> FoqsError {
    match e {
        thrift::Error::User(u) => *u.downcast::<FoqsError>().expect("a FoqsError"),
        other => panic!("expected a declared FoqsError, got {other:?}"),
    }
}

pub fn code_of(e: &Option<ItemError>) -> Option<ErrorCode> {
    e.as_ref().and_then(|e| e.code)
}

/// A port free right now on 127.0.0.1 (for configs that must name their port up front).
///
/// Not the kernel's pick (`bind(":0")`): that comes from the ephemeral range, which every
/// outgoing connection (a client, an etcd or MySQL pool) also draws from, so between this
/// call and the server's bind another socket could take it (CI saw `AddrInUse`). Ports here
/// come from below that range (12000-21999, clear of the scripts' fixed ports), handed out
/// once per process from a pid-based start, and checked free by binding them.
/// `FOQS_TEST_PORT_SLICE=0` or `1` keeps a process to one half of the range: scripts/test.sh
/// runs two test binaries at once, one in each half, so they never pick the same port.
pub fn free_port() -> u16 {
    free_ports(1)
}

/// `n` consecutive ports free now, from the same range and counter as [`free_port`].
pub fn free_ports(n: u16) -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let (low, span): (u32, u32) = match std::env::var("FOQS_TEST_PORT_SLICE").as_deref() {
        Ok("0") => (12000, 5000),
        Ok("1") => (17000, 5000),
        _ => (12000, 10000),
    };
    let _ = NEXT.compare_exchange(
        u32::MAX,
        (std::process::id() % 97) * 103 % span,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..span {
        let at = NEXT.fetch_add(u32::from(n), Ordering::SeqCst) % span;
        if at + u32::from(n) > span {
            continue;
        }
        let base = (low + at) as u16;
        if (0..n).all(|i| std::net::TcpListener::bind(("127.0.0.1", base + i)).is_ok()) {
            return base;
        }
    }
    panic!("no {n} consecutive free ports in {low}..{}", low + span);
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Polls `f` until it returns `Some`, or panics after `within`.
pub async fn eventually<T>(within: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            start.elapsed() < within,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One item of namespace `ns` with `payload` enqueued straight on `host` (topic "t", as
/// an anonymous caller): its outcome.
pub async fn enqueue_one(
    host: &foqs::core::Host,
    ns: &str,
    payload: &[u8],
) -> Result<(foqs::model::ItemId, bool), foqs::error::Error> {
    let r = host
        .enqueue(
            &foqs::core::Caller::anonymous(),
            vec![foqs::core::EnqueueRequestItem {
                ns: ns.into(),
                topic: "t".into(),
                payload: payload.to_vec(),
                ..Default::default()
            }],
            (None, None),
            None,
        )
        .await
        .unwrap();
    r.into_iter().next().unwrap()
}

/// `GET path` on the metrics listener: (status, body).
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: foqs\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out[9..12].parse().unwrap();
    let body = out.split_once("\r\n\r\n").map(|x| x.1).unwrap_or("");
    (status, body.to_string())
}

/// The value of one sample (`name{labels}`) in a scrape; 0 when absent.
pub fn sample(scrape: &str, series: &str) -> f64 {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}
