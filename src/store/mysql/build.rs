//! Building a [`MySqlStore`]: its url and connection pool, TLS, the owner lock, and the
//! server-side bound on its statements.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use mysql_async::{Opts, OptsBuilder, Pool, PoolConstraints, PoolOpts};

use super::owner::OnLost;
use super::target::Target;
use super::tls::{with_tls, MysqlTls};
use super::MySqlStore;
use crate::model::ShardId;
use crate::store::topics::TopicIds;
use crate::store::{StoreError, StoreResult};

/// Prepared statements a pooled connection keeps (mysql_async closes the least recently
/// used beyond it).
const STMT_CACHE_PER_CONNECTION: usize = 8;

impl MySqlStore {
    pub fn new(shard: ShardId, url: &str, pool_connections_max: usize) -> StoreResult<MySqlStore> {
        // Error text never carries the password.
        let shown = crate::config::redact_url(url);
        let opts = Opts::from_url(url).map_err(|e| {
            let why = e.to_string().replace(url, &shown);
            StoreError::Schema(format!("bad url {shown:?}: {why}"))
        })?;
        let database = opts
            .db_name()
            .map(str::to_string)
            .ok_or_else(|| StoreError::Schema(format!("url {shown:?} names no database")))?;
        let constraints = PoolConstraints::new(1, pool_connections_max.max(1)).expect("1 <= max");
        // mysql_async's defaults cost a drain more round trips than its statements: with no
        // idle lifetime the pool keeps one idle connection and closes every other one as it
        // comes back (3,757 connects in a 200k-item drain over four shards), and it resets
        // each returned connection (a round trip, then `setup` again). Idle connections now
        // stay, up to the bound, for a minute; nothing here leaves session state behind
        // except `unbounded_conn`, which asks for its own reset.
        let pool_opts = PoolOpts::default()
            .with_constraints(constraints)
            .with_inactive_connection_ttl(std::time::Duration::from_secs(60))
            .with_reset_connection(false);
        // Each kept connection also keeps its prepared statements on the server, which
        // allows 16,382 in all by default; most of ours are texts used once (their values
        // are in the text), so a few per connection are plenty.
        let shard_opts: Opts = OptsBuilder::from_opts(opts.clone())
            .pool_opts(pool_opts)
            .stmt_cache_size(Some(STMT_CACHE_PER_CONNECTION))
            .into();
        let server_opts: Opts = OptsBuilder::from_opts(opts).db_name(None::<String>).into();
        Ok(MySqlStore {
            shard,
            target: std::sync::RwLock::new(Arc::new(Target {
                pool: Pool::new(shard_opts.clone()),
                shard_opts,
                server_opts,
            })),
            pool_connections_max,
            statement_timeout_ms: None,
            database,
            returning: AtomicBool::new(false),
            owner_lock: None,
            owned: Arc::new(AtomicBool::new(true)),
            lock: tokio::sync::Mutex::new(None),
            check_timeout: std::time::Duration::from_secs(5),
            connect_timeout: std::time::Duration::from_secs(5),
            topics: Mutex::new(TopicIds::default()),
        })
    }

    /// Connects with TLS (every connection: the pool's, the owner lock's, the schema's).
    /// Call before [`Self::with_statement_timeout`], which keeps what this sets.
    pub fn with_tls(mut self, tls: Option<&MysqlTls>) -> MySqlStore {
        if tls.is_none() {
            return self;
        }
        let t = self.target_mut();
        t.shard_opts = with_tls(OptsBuilder::from_opts(t.shard_opts.clone()), tls).into();
        t.server_opts = with_tls(OptsBuilder::from_opts(t.server_opts.clone()), tls).into();
        t.pool = Pool::new(t.shard_opts.clone());
        self
    }

    /// Takes the shard's owner lock when opened, and refuses to open while another
    /// process holds it; once the lock is lost, every operation fails with
    /// [`StoreError::Fenced`] and `on_lost` is called (see `owner.rs`).
    pub fn with_owner_lock(mut self, on_lost: OnLost, check_timeout_ms: u64) -> MySqlStore {
        self.owner_lock = Some(on_lost);
        self.check_timeout = std::time::Duration::from_millis(check_timeout_ms);
        self
    }

    /// Bounds every statement on the server to `ms` (MariaDB's `max_statement_time`, set
    /// on each new connection): a statement the worker gave up on at its timeout cannot go
    /// on running, and commit, much later (see `shard/doubt.rs`). MySQL has no such bound
    /// for writes; there the setting is skipped (a MariaDB-only executable comment) and a
    /// timed-out write may commit later than the worker allows for.
    pub fn with_statement_timeout(mut self, ms: u64) -> MySqlStore {
        let secs = format!("{:.3}", ms as f64 / 1000.0);
        let t = self.target_mut();
        let opts: Opts = OptsBuilder::from_opts(t.shard_opts.clone())
            // `setup`, not `init`: it runs again after the pool resets a connection.
            .setup(vec![format!(
                "SET @foqs_session = 1 /*M! , SESSION max_statement_time = {secs} */"
            )])
            .into();
        t.pool = Pool::new(opts.clone());
        t.shard_opts = opts;
        self.statement_timeout_ms = Some(ms);
        self.connect_timeout = std::time::Duration::from_millis(ms.max(1000));
        self
    }
}
