//! The replication admin account's privileges, read from `SHOW GRANTS` on each server and
//! held against what the switches and failovers run (MariaDB 10.11, checked statement by
//! statement on a server):
//! - `SET GLOBAL read_only`: `READ_ONLY ADMIN` (`SUPER` no longer includes it);
//! - `RESET SLAVE ALL` at a promotion: `RELOAD`;
//! - other users' connections in `PROCESSLIST` (to end them at a fence): `PROCESS`;
//! - `SHOW SLAVE STATUS`: `SLAVE MONITOR` (or `SUPER`);
//! - `STOP`/`START SLAVE`, `CHANGE MASTER`, the replica's semi-sync: `REPLICATION SLAVE
//!   ADMIN` (or `SUPER`);
//! - the primary's semi-sync: `REPLICATION MASTER ADMIN` (or `SUPER`);
//! - `SHOW MASTER STATUS`, binlog positions: `BINLOG MONITOR` (or `SUPER`, `REPLICATION
//!   CLIENT`);
//! - `KILL CONNECTION` of the shards' account: `CONNECTION ADMIN` (or `SUPER`);
//! - the heartbeat row, read on replicas for their lag: `SELECT` on the set's first shard
//!   database (without it every replica seems to have no lag, and every switchover is
//!   refused as not ready).
//!
//! Roles are not followed: an account with roles that seems to lack something is reported
//! as not checked (it may hold it through a role).
//!
//! Each server's settings that the guarantees rest on are read too (see [`SETTINGS`]): a
//! switch on a server without them would lose what foqs answered as stored.

use std::collections::BTreeSet;

/// Each privilege needed on `*.*`, and those that also give it.
const GLOBAL: [(&str, &[&str]); 8] = [
    ("READ_ONLY ADMIN", &[]),
    ("RELOAD", &[]),
    ("PROCESS", &[]),
    ("SLAVE MONITOR", &["SUPER"]),
    ("REPLICATION SLAVE ADMIN", &["SUPER"]),
    ("REPLICATION MASTER ADMIN", &["SUPER"]),
    ("BINLOG MONITOR", &["SUPER", "REPLICATION CLIENT"]),
    ("CONNECTION ADMIN", &["SUPER"]),
];

/// What a grant is on.
#[derive(Debug, PartialEq)]
enum Target {
    Global,
    /// `` `db`.* ``: a database pattern.
    Database(String),
    /// `` `db`.`table` ``.
    Table(String, String),
}

/// One `GRANT ... ON target TO ...` line: its privileges and target. A role granted (no
/// `ON`) gives `None`.
fn parse(line: &str) -> Option<(BTreeSet<String>, Target)> {
    let rest = line.trim().strip_prefix("GRANT ")?;
    let (privs, rest) = rest.split_once(" ON ")?;
    let (target, _) = rest.split_once(" TO ")?;
    let privs = split_privileges(privs);
    let target = target.trim();
    if target == "*.*" {
        return Some((privs, Target::Global));
    }
    let unquote = |s: &str| s.trim_matches('`').replace("``", "`");
    let (db, table) = target.split_once("`.")?;
    let db = unquote(&format!("{db}`"));
    Some(match table {
        "*" => (privs, Target::Database(db)),
        t => (privs, Target::Table(db, unquote(t))),
    })
}

/// Whether these `SHOW GRANTS` lines grant roles (whose privileges are not followed).
pub fn has_roles(grants: &[String]) -> bool {
    grants
        .iter()
        .any(|g| g.trim().starts_with("GRANT ") && !g.contains(" ON "))
}

/// "SELECT, INSERT (a, b), ALL PRIVILEGES" -> {SELECT, INSERT, ALL PRIVILEGES}.
fn split_privileges(s: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut depth = 0;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.insert(cur.trim().to_uppercase());
                cur.clear();
            }
            _ if depth == 0 => cur.push(c),
            _ => {}
        }
    }
    out.insert(cur.trim().to_uppercase());
    out.retain(|p| !p.is_empty());
    out
}

/// Whether `db` matches a grant's database pattern (`%`, `_`, and `\` escaping them).
fn matches(pattern: &str, db: &str) -> bool {
    fn go(p: &[char], d: &[char]) -> bool {
        match p.split_first() {
            None => d.is_empty(),
            Some(('%', rest)) => (0..=d.len()).any(|i| go(rest, &d[i..])),
            Some(('_', rest)) => !d.is_empty() && go(rest, &d[1..]),
            Some(('\\', rest)) if !rest.is_empty() => {
                d.first() == Some(&rest[0]) && go(&rest[1..], &d[1..])
            }
            Some((c, rest)) => d.first() == Some(c) && go(rest, &d[1..]),
        }
    }
    let (p, d): (Vec<char>, Vec<char>) = (pattern.chars().collect(), db.chars().collect());
    go(&p, &d)
}

/// What the account whose `SHOW GRANTS` lines these are lacks: each privilege (with what
/// else would do), and `SELECT` on each of `databases` it cannot read.
pub fn missing(grants: &[String], databases: &[String]) -> Vec<String> {
    let parsed: Vec<_> = grants.iter().filter_map(|g| parse(g)).collect();
    let global: BTreeSet<String> = parsed
        .iter()
        .filter(|(_, t)| *t == Target::Global)
        .flat_map(|(p, _)| p.iter().cloned())
        .collect();
    let all = |p: &BTreeSet<String>| p.contains("ALL PRIVILEGES") || p.contains("ALL");
    if all(&global) {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (need, or) in GLOBAL {
        if !global.contains(need) && !or.iter().any(|o| global.contains(*o)) {
            out.push(match or {
                [] => format!("{need} ON *.*"),
                _ => format!("{need} ON *.* (or {})", or.join(" or ")),
            });
        }
    }
    for db in databases {
        let readable = global.contains("SELECT")
            || parsed.iter().any(|(p, t)| {
                let on = match t {
                    Target::Database(pat) => matches(pat, db),
                    Target::Table(d, table) => d == db && table == "foqs_heartbeat",
                    Target::Global => false,
                };
                on && (p.contains("SELECT") || all(p))
            });
        if !readable {
            out.push(format!("SELECT ON `{db}`.* (the heartbeat row)"));
        }
    }
    out
}

/// Each server setting a replicated shard's guarantees rest on, the value it must have, and
/// what goes wrong without it.
pub const SETTINGS: [(&str, &str, &str); 7] = [
    (
        "rpl_semi_sync_master_wait_point",
        "AFTER_SYNC",
        "under AFTER_COMMIT a commit is visible before a replica has it: an enqueue found committed after its reply was lost can be answered OK and then lost by a failover",
    ),
    ("log_bin", "1", "replicas cannot follow a server without a binary log"),
    ("binlog_format", "ROW", "a promotion needs row events to compare positions exactly"),
    (
        "log_slave_updates",
        "1",
        "a promoted replica's binary log would lack what it applied",
    ),
    (
        "gtid_strict_mode",
        "1",
        "errant transactions on a replica would go unnoticed until a promotion",
    ),
    ("sync_binlog", "1", "a crash can lose binlogged commits"),
    (
        "innodb_flush_log_at_trx_commit",
        "1",
        "a crash can lose committed transactions",
    ),
];

/// Which of [`SETTINGS`] these server values (name, value as the server says it) break, each
/// said as the fix and why.
pub fn unsafe_settings(values: &[(String, String)]) -> Vec<String> {
    SETTINGS
        .iter()
        .filter_map(|(name, want, why)| {
            let have = values
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str());
            let ok = match (have, *want) {
                (Some(v), "1") => v == "1" || v.eq_ignore_ascii_case("ON"),
                (Some(v), w) => v.eq_ignore_ascii_case(w),
                (None, _) => false,
            };
            (!ok).then(|| {
                format!(
                    "{name} = {want} (it is {}: {why})",
                    have.unwrap_or("not set")
                )
            })
        })
        .collect()
}

/// What one server's check found: privileges the admin account lacks, and settings the
/// guarantees need that it does not have.
#[derive(Debug, Default)]
pub struct Findings {
    pub lacks: Vec<String>,
    pub settings: Vec<String>,
}

/// One server's check; `Err` when the server could not be asked.
pub type ServerCheck = (String, Result<Findings, String>);

/// Asks every server of every configured replica set, as the admin account, what it may
/// do, and says what it lacks there (see [`missing`]); a few seconds at most per server.
pub async fn check_servers(cfg: &crate::config::Config) -> Vec<ServerCheck> {
    let layout = super::Layout::from_config(cfg);
    let r = &cfg.replication;
    let asks = layout.sets.iter().flat_map(|set| {
        let db = super::driver::heartbeat_db(&set.heartbeat_url);
        set.servers.iter().map(move |s| {
            let admin = super::server::ServerAdmin::new(
                r,
                &s.addr,
                s.tls.as_ref(),
                std::time::Duration::from_secs(3),
            );
            let db = db.clone();
            async move {
                let read = admin
                    .with(std::time::Duration::from_secs(3), |c| {
                        Box::pin(async move {
                            use mysql_async::prelude::Queryable;
                            let grants = c
                                .query::<String, _>("SHOW GRANTS")
                                .await
                                .map_err(|e| e.to_string())?;
                            let names: Vec<String> =
                                SETTINGS.iter().map(|(n, _, _)| format!("'{n}'")).collect();
                            let values = c
                                .query::<(String, String), _>(format!(
                                    "SHOW GLOBAL VARIABLES WHERE Variable_name IN ({})",
                                    names.join(", ")
                                ))
                                .await
                                .map_err(|e| e.to_string())?;
                            Ok((grants, values))
                        })
                    })
                    .await;
                let r = read.and_then(|(g, values)| {
                    let lacks = missing(&g, &[db]);
                    if !lacks.is_empty() && has_roles(&g) {
                        // It may hold them through a role.
                        return Err(format!(
                            "the account has roles, whose privileges are not followed; without them it lacks {}",
                            lacks.join(", ")
                        ));
                    }
                    Ok(Findings {
                        lacks,
                        settings: unsafe_settings(&values),
                    })
                });
                (admin.addr.clone(), r)
            }
        })
    });
    futures::future::join_all(asks).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(lines: &[&str]) -> Vec<String> {
        lines.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn what_the_readme_once_listed_is_not_enough_on_10_11() {
        let once = g(&["GRANT PROCESS, BINLOG MONITOR, CONNECTION ADMIN, READ_ONLY ADMIN, REPLICATION SLAVE ADMIN, REPLICATION MASTER ADMIN ON *.* TO `admin`@`%`"]);
        let m = missing(&once, &["foqs_0".into()]);
        assert_eq!(
            m,
            vec![
                "RELOAD ON *.*".to_string(),
                "SLAVE MONITOR ON *.* (or SUPER)".into(),
                "SELECT ON `foqs_0`.* (the heartbeat row)".into()
            ]
        );
    }

    #[test]
    fn the_listed_grants_suffice_and_all_privileges_does() {
        let enough = g(&[
            "GRANT RELOAD, PROCESS, BINLOG MONITOR, CONNECTION ADMIN, READ_ONLY ADMIN, SLAVE MONITOR, REPLICATION SLAVE ADMIN, REPLICATION MASTER ADMIN ON *.* TO `admin`@`%` IDENTIFIED BY PASSWORD '*X'",
            "GRANT SELECT ON `foqs\\_%`.* TO `admin`@`%`",
        ]);
        assert!(missing(&enough, &["foqs_0".into()]).is_empty());
        // `foqs\_%` is foqs_ then anything: not fooqs0.
        assert_eq!(missing(&enough, &["foqsx0".into()]).len(), 1);
        let root = g(&[
            "GRANT ALL PRIVILEGES ON *.* TO `root`@`127.0.0.1` WITH GRANT OPTION",
            "GRANT PROXY ON ''@'%' TO 'root'@'127.0.0.1' WITH GRANT OPTION",
        ]);
        assert!(missing(&root, &["foqs_0".into()]).is_empty());
        let su = g(&["GRANT SUPER ON *.* TO `su`@`%`"]);
        assert_eq!(
            missing(&su, &[]),
            vec!["READ_ONLY ADMIN ON *.*", "RELOAD ON *.*", "PROCESS ON *.*"]
        );
        let db_all = g(&[
            "GRANT READ_ONLY ADMIN, RELOAD, PROCESS, SUPER ON *.* TO `a`@`%`",
            "GRANT ALL PRIVILEGES ON `foqs%`.* TO `a`@`%`",
            "GRANT `ops_role` TO `a`@`%`",
            "GRANT SELECT (id) ON `other`.`t` TO `a`@`%`",
        ]);
        assert!(missing(&db_all, &["foqs_shard_0".into()]).is_empty());
        assert!(has_roles(&db_all));
        let table = g(&[
            "GRANT READ_ONLY ADMIN, RELOAD, PROCESS, SUPER ON *.* TO `a`@`%`",
            "GRANT SELECT ON `foqs_0`.`foqs_heartbeat` TO `a`@`%`",
        ]);
        assert!(missing(&table, &["foqs_0".into()]).is_empty());
        assert_eq!(missing(&table, &["foqs_1".into()]).len(), 1);
    }

    #[test]
    fn settings_the_guarantees_rest_on() {
        let v = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };
        let good = v(&[
            ("rpl_semi_sync_master_wait_point", "AFTER_SYNC"),
            ("log_bin", "ON"),
            ("binlog_format", "ROW"),
            ("log_slave_updates", "ON"),
            ("gtid_strict_mode", "ON"),
            ("sync_binlog", "1"),
            ("innodb_flush_log_at_trx_commit", "1"),
        ]);
        assert!(unsafe_settings(&good).is_empty());
        let mut bad = good.clone();
        bad[0].1 = "AFTER_COMMIT".into();
        bad[5].1 = "0".into();
        bad.remove(4);
        let found = unsafe_settings(&bad);
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(found[0]
            .starts_with("rpl_semi_sync_master_wait_point = AFTER_SYNC (it is AFTER_COMMIT"));
        assert!(found[1].starts_with("gtid_strict_mode = 1 (it is not set"));
        assert!(found[2].starts_with("sync_binlog = 1 (it is 0"));
    }

    #[test]
    fn database_patterns() {
        assert!(matches("foqs%", "foqs_shard_0"));
        assert!(matches("foqs\\_%", "foqs_1"));
        assert!(!matches("foqs\\_%", "foqsx1"));
        assert!(matches("f_qs", "foqs"));
        assert!(!matches("foqs", "foqs_0"));
    }
}
