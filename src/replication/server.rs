//! One MariaDB server, as the replication driver administers it: `read_only`, GTID
//! positions, replica status, promotion and repointing, through the admin account
//! (`replication.admin_user`), one short-lived connection per step, or one kept across
//! the steps of a switch's read-only window ([`Kept`]).

use std::time::Duration;

use mysql_async::prelude::*;
use mysql_async::{Conn, Opts, OptsBuilder, Row};

/// A failed step, in words for the report.
pub type Step<T> = Result<T, String>;

fn words(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// How to reach one server as the admin account.
#[derive(Clone)]
pub struct ServerAdmin {
    pub addr: String,
    opts: Opts,
    timeout: Duration,
}

impl ServerAdmin {
    /// The admin account of `cfg` on `addr`, over `[replication] tls`, else the server's
    /// own TLS settings (`server_tls`).
    pub fn new(
        cfg: &super::config::ReplicationConfig,
        addr: &str,
        server_tls: Option<&crate::store::MysqlTls>,
        timeout: Duration,
    ) -> ServerAdmin {
        let (user, password) = (&cfg.admin_user, &cfg.admin_password);
        let tls = cfg.tls.as_ref().or(server_tls);
        let (host, port) = addr.rsplit_once(':').unwrap_or((addr, "3306"));
        let opts = OptsBuilder::default()
            .ip_or_hostname(host.to_string())
            .tcp_port(port.parse().unwrap_or(3306))
            .user(Some(user.to_string()))
            .pass((!password.is_empty()).then(|| password.to_string()))
            .prefer_socket(false);
        let opts = crate::store::with_tls(opts, tls).into();
        ServerAdmin {
            addr: addr.to_string(),
            opts,
            timeout,
        }
    }

    /// A connection, within the timeout (a frozen server accepts TCP but never answers).
    pub async fn connect(&self) -> Step<Conn> {
        match tokio::time::timeout(self.timeout, Conn::new(self.opts.clone())).await {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) => Err(format!("{}: {e}", self.addr)),
            Err(_) => Err(format!(
                "{}: no answer within {:?}",
                self.addr, self.timeout
            )),
        }
    }

    /// Runs one statement on a new connection, within `bound`.
    pub async fn exec(&self, bound: Duration, sql: &'static str) -> Step<()> {
        self.with(bound, |c| {
            Box::pin(async move { c.query_drop(sql).await.map_err(words) })
        })
        .await
    }

    /// Runs `f` on a new connection, the whole of it within `bound`.
    pub async fn with<T, F>(&self, bound: Duration, f: F) -> Step<T>
    where
        F: for<'c> FnOnce(&'c mut Conn) -> futures::future::BoxFuture<'c, Step<T>>,
    {
        let addr = self.addr.clone();
        let run = async {
            let mut c = self.connect().await?;
            let r = f(&mut c).await;
            let _ = c.disconnect().await;
            r
        };
        match tokio::time::timeout(bound, run).await {
            Ok(r) => r.map_err(|e| {
                if e.starts_with(&addr) {
                    e
                } else {
                    format!("{addr}: {e}")
                }
            }),
            Err(_) => Err(format!("{addr}: no answer within {bound:?}")),
        }
    }
}

/// A connection to one server kept across the steps of one switch (see
/// [`Kept::step`]), so that the steps inside a read-only window do not each pay a
/// connect (a TLS handshake and a login).
pub struct Kept<'a> {
    admin: &'a ServerAdmin,
    conn: Option<Conn>,
}

impl<'a> Kept<'a> {
    /// Connected now when it can be; else each step connects as [`ServerAdmin::with`] does.
    pub async fn open(admin: &'a ServerAdmin) -> Kept<'a> {
        Kept {
            admin,
            conn: admin.connect().await.ok(),
        }
    }

    /// Runs `f` within `bound` on the kept connection, or on a new one when none is kept.
    /// A step that fails on the kept connection drops it (it may be half way through a
    /// statement, or have died while kept) and runs once more on a new one: the steps
    /// kept across a switch are each safe to run twice (read-only on, positions read, a
    /// wait, a promotion). A step that ran out of `bound` is not run again.
    pub async fn step<T, F>(&mut self, bound: Duration, f: F) -> Step<T>
    where
        F: for<'c> Fn(&'c mut Conn) -> futures::future::BoxFuture<'c, Step<T>>,
    {
        let Some(mut c) = self.conn.take() else {
            return self.admin.with(bound, f).await;
        };
        let started = std::time::Instant::now();
        match tokio::time::timeout(bound, f(&mut c)).await {
            Ok(Ok(v)) => {
                self.conn = Some(c);
                Ok(v)
            }
            Ok(Err(e)) => {
                tracing::debug!(server = %self.admin.addr, error = %e, "a kept admin connection failed a step; once more on a new one");
                let left = bound.saturating_sub(started.elapsed());
                self.admin.with(left, f).await
            }
            Err(_) => Err(format!("{}: no answer within {bound:?}", self.admin.addr)),
        }
    }

    /// Closes the kept connection.
    pub async fn close(mut self) {
        if let Some(c) = self.conn.take() {
            let _ = c.disconnect().await;
        }
    }
}

/// The sequence number of `domain` in a GTID position such as `0-1-42,1-2-7`.
pub fn seq_of(pos: &str, domain: u32) -> Option<u64> {
    pos.split(',').find_map(|g| {
        let mut it = g.trim().splitn(3, '-');
        let d: u32 = it.next()?.parse().ok()?;
        let _server: u32 = it.next()?.parse().ok()?;
        let seq: u64 = it.next()?.parse().ok()?;
        (d == domain).then_some(seq)
    })
}

/// The last sequence number of each (domain, server id) in a `gtid_binlog_state`.
pub fn binlog_state(state: &str) -> Vec<(u32, u32, u64)> {
    state
        .split(',')
        .filter_map(|g| {
            let mut it = g.trim().splitn(3, '-');
            Some((
                it.next()?.parse().ok()?,
                it.next()?.parse().ok()?,
                it.next()?.parse().ok()?,
            ))
        })
        .collect()
}

/// The GTIDs `old` holds that `new` lacks: for each (domain, server) the sequence
/// numbers of `old`'s state above `new`'s. Empty: `old`'s history is a prefix of `new`'s.
pub fn errant(old_state: &str, new_state: &str) -> Vec<String> {
    let new = binlog_state(new_state);
    binlog_state(old_state)
        .into_iter()
        .filter(|(d, s, seq)| {
            let have = new
                .iter()
                .filter(|(nd, ns, _)| nd == d && ns == s)
                .map(|(_, _, n)| *n)
                .max();
            have.is_none_or(|h| h < *seq)
        })
        .map(|(d, s, seq)| format!("{d}-{s}-{seq}"))
        .collect()
}

pub async fn set_read_only(c: &mut Conn, on: bool) -> Step<()> {
    // Bounded: read_only waits for running commits, which a stalled replica can hold.
    c.query_drop("SET SESSION lock_wait_timeout = 2")
        .await
        .map_err(words)?;
    c.query_drop(format!(
        "SET GLOBAL read_only = {}",
        if on { "ON" } else { "OFF" }
    ))
    .await
    .map_err(words)
}

pub async fn read_only(c: &mut Conn) -> Step<bool> {
    let v: Option<i64> = c
        .query_first("SELECT @@global.read_only")
        .await
        .map_err(words)?;
    Ok(v == Some(1))
}

/// `gtid_binlog_pos`: the last transaction of each domain in the binlog.
pub async fn binlog_pos(c: &mut Conn) -> Step<String> {
    text_of(c, "SELECT @@global.gtid_binlog_pos").await
}

/// `gtid_slave_pos`: the last transaction of each domain this replica applied.
pub async fn slave_pos(c: &mut Conn) -> Step<String> {
    text_of(c, "SELECT @@global.gtid_slave_pos").await
}

/// `gtid_binlog_state`: the last transaction of each (domain, server) in the binlog.
pub async fn binlog_state_of(c: &mut Conn) -> Step<String> {
    text_of(c, "SELECT @@global.gtid_binlog_state").await
}

async fn text_of(c: &mut Conn, sql: &str) -> Step<String> {
    let v: Option<String> = c.query_first(sql).await.map_err(words)?;
    Ok(v.unwrap_or_default())
}

/// What `SHOW SLAVE STATUS` says of the default connection; `None` on a server that
/// replicates from nobody.
#[derive(Debug, Clone, Default)]
pub struct ReplicaStatus {
    pub master: String,
    pub io_running: bool,
    pub sql_running: bool,
    /// The last transaction received (relay log).
    pub io_pos: String,
    /// The last transaction applied.
    pub slave_pos: String,
    pub error: String,
}

pub async fn replica_status(c: &mut Conn) -> Step<Option<ReplicaStatus>> {
    let row: Option<Row> = c.query_first("SHOW SLAVE STATUS").await.map_err(words)?;
    let Some(row) = row else { return Ok(None) };
    let text = |name: &str| -> String {
        row.get_opt::<Option<String>, &str>(name)
            .and_then(|r| r.ok())
            .flatten()
            .unwrap_or_default()
    };
    let slave_pos: Option<String> = c
        .query_first("SELECT @@global.gtid_slave_pos")
        .await
        .map_err(words)?;
    let error = [text("Last_IO_Error"), text("Last_SQL_Error")]
        .into_iter()
        .filter(|e| !e.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    Ok(Some(ReplicaStatus {
        master: format!("{}:{}", text("Master_Host"), text("Master_Port")),
        io_running: text("Slave_IO_Running") == "Yes",
        sql_running: text("Slave_SQL_Running") == "Yes",
        io_pos: text("Gtid_IO_Pos"),
        slave_pos: slave_pos.unwrap_or_default(),
        error,
    }))
}

/// Waits until this server has applied `pos`; false at the timeout.
pub async fn wait_for(c: &mut Conn, pos: &str, timeout: Duration) -> Step<bool> {
    let v: Option<i64> = c
        .exec_first(
            "SELECT MASTER_GTID_WAIT(?, ?)",
            (pos, timeout.as_secs_f64()),
        )
        .await
        .map_err(words)?;
    Ok(v == Some(0))
}

/// Semi-synchronous replication as the primary's side sees it: on, commits that got no
/// acknowledgement (fell back to asynchronous), replicas that acknowledge.
#[derive(Debug, Clone, Default)]
pub struct SemiSync {
    /// Waiting for acknowledgements now (`Rpl_semi_sync_master_status`).
    pub on: bool,
    /// Configured to (`rpl_semi_sync_master_enabled`).
    pub enabled: bool,
    pub no_tx: i64,
    pub clients: i64,
    pub replica_enabled: bool,
}

pub async fn semi_sync(c: &mut Conn) -> Step<SemiSync> {
    let rows: Vec<(String, String)> = c
        .query("SHOW GLOBAL STATUS WHERE Variable_name IN ('Rpl_semi_sync_master_status', 'Rpl_semi_sync_master_no_tx', 'Rpl_semi_sync_master_clients')")
        .await
        .map_err(words)?;
    let mut s = SemiSync::default();
    for (k, v) in rows {
        match k.as_str() {
            "Rpl_semi_sync_master_status" => s.on = v == "ON",
            "Rpl_semi_sync_master_no_tx" => s.no_tx = v.parse().unwrap_or(0),
            "Rpl_semi_sync_master_clients" => s.clients = v.parse().unwrap_or(0),
            _ => {}
        }
    }
    let r: Option<i64> = c
        .query_first("SELECT @@global.rpl_semi_sync_slave_enabled")
        .await
        .map_err(words)?;
    s.replica_enabled = r == Some(1);
    let m: Option<i64> = c
        .query_first("SELECT @@global.rpl_semi_sync_master_enabled")
        .await
        .map_err(words)?;
    s.enabled = m == Some(1);
    Ok(s)
}

/// Tells the replication IO thread to stop, without waiting for it: a thread stuck
/// connecting to a frozen primary ends only when its attempt does (about 2 s here, with
/// `slave_net_timeout = 1` and `MASTER_CONNECT_RETRY = 1`); meanwhile it receives nothing,
/// and it does not start receiving once told to stop.
pub async fn kill_io(c: &mut Conn) -> Step<()> {
    let ids: Vec<u64> = c
        .query("SELECT ID FROM information_schema.PROCESSLIST WHERE USER = 'system user' AND COMMAND IN ('Connect', 'Slave_IO')")
        .await
        .map_err(words)?;
    for id in ids {
        let _ = c.query_drop(format!("KILL {id}")).await;
    }
    Ok(())
}

/// Stops the replication IO thread, waiting until it has stopped (see [`kill_io`]).
pub async fn stop_io(c: &mut Conn) -> Step<()> {
    kill_io(c).await?;
    c.query_drop("STOP SLAVE IO_THREAD").await.map_err(words)
}

/// [`promote`] without waiting for an IO thread stuck connecting to a frozen primary (a
/// failover's): the IO thread told to stop, the SQL thread stopped (the relay log applied
/// up to what was received), the primary side of semi-sync as asked, writable. The old
/// primary is forgotten ([`forget_primary`]) once the IO thread has stopped.
pub async fn promote_now(c: &mut Conn, semi_sync: bool) -> Step<()> {
    kill_io(c).await?;
    become_primary(c, semi_sync, &["STOP SLAVE SQL_THREAD"]).await
}

/// Runs `first`, then the primary side of semi-sync as asked, and makes the server
/// writable.
async fn become_primary(c: &mut Conn, semi_sync: bool, first: &[&str]) -> Step<()> {
    let semi = if semi_sync {
        "SET GLOBAL rpl_semi_sync_master_enabled = ON"
    } else {
        "SET GLOBAL rpl_semi_sync_master_enabled = OFF"
    };
    let rest = [
        semi,
        "SET SESSION lock_wait_timeout = 2",
        "SET GLOBAL read_only = OFF",
    ];
    for q in first.iter().chain(&rest) {
        c.query_drop(*q).await.map_err(|e| format!("{q}: {e}"))?;
    }
    Ok(())
}

/// After [`promote_now`]: waits for the IO thread to stop, then drops the replication
/// settings, so that nothing ever replicates from the old primary again.
pub async fn forget_primary(c: &mut Conn) -> Step<()> {
    for q in ["STOP SLAVE", "RESET SLAVE ALL"] {
        c.query_drop(q).await.map_err(|e| format!("{q}: {e}"))?;
    }
    Ok(())
}

/// Stops replicating (the relay log applied up to what was received), forgets the old
/// primary, becomes a primary (waiting for a replica's acknowledgement of every commit
/// when `semi_sync`) and writable.
pub async fn promote(c: &mut Conn, semi_sync: bool) -> Step<()> {
    stop_io(c).await?;
    become_primary(c, semi_sync, &["STOP SLAVE", "RESET SLAVE ALL"]).await
}

/// Replicates from `primary` from this server's own last transaction on (`current_pos`:
/// a demoted primary's binlog, or a replica's applied position), read-only, its primary
/// side of semi-sync off.
pub async fn follow(c: &mut Conn, primary: &str, ch: &super::config::Channel) -> Step<()> {
    let (host, port) = primary.rsplit_once(':').ok_or("primary is not HOST:PORT")?;
    let port: u16 = port.parse().map_err(words)?;
    c.query_drop("SET SESSION lock_wait_timeout = 2")
        .await
        .map_err(words)?;
    c.query_drop("SET GLOBAL read_only = ON")
        .await
        .map_err(words)?;
    c.query_drop("SET GLOBAL rpl_semi_sync_master_enabled = OFF")
        .await
        .map_err(words)?;
    stop_io(c).await?;
    c.query_drop("STOP SLAVE").await.map_err(words)?;
    // CHANGE MASTER takes no placeholders: its strings are spliced in as quoted literals.
    let ssl = match &ch.ssl_ca {
        Some(ca) => format!(
            ", MASTER_SSL = 1, MASTER_SSL_CA = {}, MASTER_SSL_VERIFY_SERVER_CERT = 1",
            quoted(ca)
        ),
        None => String::new(),
    };
    c.query_drop(format!(
        "CHANGE MASTER TO MASTER_HOST = {}, MASTER_PORT = {port}, MASTER_USER = {}, MASTER_PASSWORD = {}, \
         MASTER_USE_GTID = current_pos, MASTER_CONNECT_RETRY = 1, MASTER_HEARTBEAT_PERIOD = 0.25{ssl}",
        quoted(host),
        quoted(&ch.user),
        quoted(&ch.password)
    ))
    .await
    .map_err(|e| format!("CHANGE MASTER: {e}"))?;
    c.query_drop("START SLAVE").await.map_err(words)
}

/// `s` as an SQL string literal (backslashes and quotes escaped).
fn quoted(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// Ends every connection of `user` (the old primary's foqsd connections, at a fence).
pub async fn kill_user(c: &mut Conn, user: &str) -> Step<u64> {
    let ids: Vec<u64> = c
        .exec(
            "SELECT ID FROM information_schema.PROCESSLIST WHERE USER = ?",
            (user,),
        )
        .await
        .map_err(words)?;
    let mut n = 0;
    for id in ids {
        if c.query_drop(format!("KILL CONNECTION {id}")).await.is_ok() {
            n += 1;
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_are_quoted() {
        assert_eq!(quoted("a'b\\c"), "'a\\'b\\\\c'");
    }

    #[test]
    fn positions_and_errant_transactions() {
        assert_eq!(seq_of("0-1-42", 0), Some(42));
        assert_eq!(seq_of("1-3-7,0-2-9", 0), Some(9));
        assert_eq!(seq_of("", 0), None);
        // The new primary (server 2) took over at 0-1-40 and wrote on.
        assert!(errant("0-1-40", "0-1-40,0-2-55").is_empty());
        assert_eq!(errant("0-1-42", "0-1-40,0-2-55"), vec!["0-1-42"]);
        assert_eq!(errant("0-3-1", "0-1-40"), vec!["0-3-1"]);
    }
}
