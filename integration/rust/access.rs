//! TLS and namespace access control over real TLS connections: client identities from
//! certificates, each identity confined to the namespaces and kinds of call its
//! `[[access]]` entries grant (ids checked by their item's namespace), anonymous callers,
//! a certificate from another CA refused at the handshake, a forged `forwarded_by`
//! refused, and peers that forward for a client over TLS.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use foqs::clock::SystemClock;
use foqs::config::Config;
use foqs::thrift_gen::*;
use foqs::tls::{client_config, ClientTlsFiles};

/// Throwaway certificates from `scripts/certs.sh`, one directory per test binary run,
/// under cargo's scratch folder for tests (`target/tmp`). Nothing is left to remove them
/// at the end of a run (a static), so each run removes those of earlier runs that ended.
pub(crate) fn certs() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let scratch = Path::new(env!("CARGO_TARGET_TMPDIR"));
        for old in std::fs::read_dir(scratch).into_iter().flatten().flatten() {
            let name = old.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix("access-certs-") {
                if !Path::new("/proc").join(pid).exists() {
                    let _ = std::fs::remove_dir_all(old.path());
                }
            }
        }
        let dir = scratch.join(format!("access-certs-{}", std::process::id()));
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/certs.sh");
        let ok = Command::new("bash")
            .arg(script)
            .arg(&dir)
            .args(["alice", "bob", "ops", "host-1", "host-2", "rsa-db"])
            .status()
            .expect("run scripts/certs.sh");
        assert!(ok.success());
        dir
    })
    .clone()
}

fn tls_client(addr: std::net::SocketAddr, who: Option<&str>) -> thrift::Result<Client> {
    let dir = certs();
    let files = ClientTlsFiles {
        ca_file: Some(dir.join("ca.pem")),
        cert_file: who.map(|w| dir.join(format!("{w}.pem"))),
        key_file: who.map(|w| dir.join(format!("{w}.key"))),
    };
    let cfg = client_config(&files).unwrap();
    foqs::client::connect_tls(
        &addr.to_string(),
        Proto::Binary,
        Duration::from_secs(20),
        cfg,
    )
    .map(Client::from_sync)
}

const RULES: &str = r#"
[[access]]
identity = "alice"
namespaces = ["a"]
allow = ["produce", "consume"]
[[access]]
identity = "bob"
namespaces = ["b"]
allow = ["produce", "consume"]
[[access]]
identity = "ops"
namespaces = ["*"]
allow = ["admin"]
[[access]]
identity = "host-1"
namespaces = []
allow = ["peer"]
[[access]]
identity = "host-2"
namespaces = []
allow = ["peer"]
"#;

fn server_tls(mtls: bool) -> String {
    let dir = certs();
    let ca = if mtls {
        format!("client_ca_file = \"{}\"\n", dir.join("ca.pem").display())
    } else {
        String::new()
    };
    format!(
        "[server.tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n{ca}",
        dir.join("server.pem").display(),
        dir.join("server.key").display()
    )
}

fn denied(e: &Option<ItemError>) -> bool {
    code_of(e) == Some(ErrorCode::PERMISSION_DENIED)
}

fn whole_call_denied<T: std::fmt::Debug>(r: thrift::Result<T>) -> String {
    let e = foqs_error(r.expect_err("the call is refused"));
    assert_eq!(e.code, Some(ErrorCode::PERMISSION_DENIED), "{e:?}");
    e.message.unwrap()
}

/// One host on `shards` new shards under `RULES`, its Thrift port speaking TLS (`tls`, a
/// `[server.tls]` table); `server_extra` lines go into `[server]`.
async fn tls_host(shards: usize, server_extra: &str, tls: &str) -> (TestDb, foqs::daemon::Running) {
    let db = TestDb::new(shards);
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n{server_extra}{tls}\n{}\n{FAST_ENGINE}\n{RULES}",
        db.shards_toml()
    );
    let cfg = Config::from_toml(&toml).unwrap();
    let running = foqs::daemon::start(&cfg, Arc::new(SystemClock))
        .await
        .unwrap();
    (db, running)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_identity_is_confined_to_its_namespaces_over_mtls() {
    let (db, running) = tls_host(2, "", &server_tls(true)).await;
    let addr = running.addr;
    let mut alice = tls_client(addr, Some("alice")).unwrap();
    let mut bob = tls_client(addr, Some("bob")).unwrap();
    let mut ops = tls_client(addr, Some("ops")).unwrap();

    // Produce: per item, never partially applied to a denied item.
    let r = alice
        .try_enqueue(vec![
            item("a", "t", 0, b"mine"),
            item("b", "t", 0, b"not mine"),
        ])
        .unwrap();
    assert!(r[0].error.is_none());
    assert!(denied(&r[1].error), "{:?}", r[1].error);
    let xb = bob.enqueue(vec![item("b", "t", 0, b"bob's")]).remove(0);
    assert_eq!(
        bob.dequeue("b", "t", 10).len(),
        1,
        "only bob's item is in b"
    );

    // Consume: whole calls in another namespace are refused.
    let msg = whole_call_denied(alice.try_dequeue(vec![topic_req("b", "t", 1)]));
    assert!(
        msg.contains("\"alice\" may not consume in namespace \"b\""),
        "{msg}"
    );
    whole_call_denied(alice.try_peek("b", "t", 1));
    whole_call_denied(alice.try_topics("b", None, None));
    whole_call_denied(alice.call(|c| {
        c.topic_stats(TopicStatsRequest {
            forwarded_for: None,
            ns: Some("b".into()),
            topic: Some("t".into()),
            local_only: None,
        })
    }));
    // Ids are checked by their item's namespace, before anything changes.
    assert!(denied(&alice.ack(std::slice::from_ref(&xb))[0].error));
    assert!(denied(&alice.nack(vec![nack(&xb, None, None)])[0].error));
    assert!(denied(&alice.touch(&[(&xb, 1000)])[0].error));
    assert_eq!(bob.stats("b", "t").leased, Some(1), "still bob's lease");
    // Admin: only ops purges.
    let purge = |c: &mut Client| {
        c.call(|c| {
            c.dlq_purge(DlqPurgeRequest {
                forwarded_for: None,
                ns: Some("b".into()),
                topic: Some("t".into()),
                local_only: None,
            })
        })
    };
    whole_call_denied(purge(&mut alice));
    whole_call_denied(purge(&mut bob));
    assert_eq!(purge(&mut ops).unwrap().count, Some(0));
    // getHostInfo is open to everyone who got through TLS.
    assert_eq!(alice.host_info().shards.unwrap().len(), 2);
    assert!(bob.ack(&[xb])[0].error.is_none());

    // A forged forwarded_by from a client that is not a peer is refused.
    let forged = alice.call(|c| {
        c.ack(AckRequest {
            ids: Some(vec!["0:1".into()]),
            forwarded_by: Some("h9".into()),
            forwarded_for: Some("ops".into()),
            lease_ids: None,
        })
    });
    let msg = whole_call_denied(forged);
    assert!(msg.contains("only the hosts of a cluster may"), "{msg}");
    // A single host has no peers: not even a certificate allowed "peer" is one here (the
    // owner's check of the client a peer acts for is in the cluster test below).
    let xa = alice.enqueue(vec![item("a", "t", 1, b"x")]).remove(0);
    let mut peer = tls_client(addr, Some("host-2")).unwrap();
    let as_bob = peer.call(|c| {
        c.ack(AckRequest {
            ids: Some(vec![xa.clone()]),
            forwarded_by: Some("h2".into()),
            forwarded_for: Some("bob".into()),
            lease_ids: None,
        })
    });
    whole_call_denied(as_bob);
    let as_alice = peer.call(|c| {
        c.ack(AckRequest {
            ids: Some(vec![xa.clone()]),
            forwarded_by: Some("h2".into()),
            forwarded_for: Some("alice".into()),
            lease_ids: None,
        })
    });
    whole_call_denied(as_alice);
    assert!(alice.ack(&[xa])[0].error.is_none());

    // No certificate, or one from another CA: refused at the handshake.
    assert!(tls_client(addr, None)
        .and_then(|mut c| c.call(|c| c.get_host_info()))
        .is_err());
    let dir = certs();
    let intruder = ClientTlsFiles {
        ca_file: Some(dir.join("ca.pem")),
        cert_file: Some(dir.join("intruder.pem")),
        key_file: Some(dir.join("intruder.key")),
    };
    let refused = foqs::client::connect_tls(
        &addr.to_string(),
        Proto::Binary,
        Duration::from_secs(5),
        client_config(&intruder).unwrap(),
    )
    .and_then(|mut c| {
        use foqs::thrift_gen::TFoqsSyncClient;
        c.get_host_info()
    });
    assert!(
        refused.is_err(),
        "a certificate from another CA got through"
    );

    // foqsctl speaks TLS with the same files, and reports a refusal.
    let foqsctl = |who: &str, args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_foqsctl"))
            .args(["--host", &addr.to_string()])
            .env("FOQS_TLS_CA", dir.join("ca.pem"))
            .env("FOQS_TLS_CERT", dir.join(format!("{who}.pem")))
            .env("FOQS_TLS_KEY", dir.join(format!("{who}.key")))
            .args(args)
            .output()
            .unwrap()
    };
    let out = foqsctl(
        "alice",
        &["enqueue", "--ns", "a", "--topic", "cli", "--payload", "hi"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = foqsctl("alice", &["dequeue", "--ns", "b", "--topic", "t"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("may not consume"));
    let out = foqsctl("ops", &["dlq", "purge", "--ns", "a", "--topic", "cli"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    running.shutdown().await;
    drop(db);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_callers_get_only_what_star_grants() {
    // Plain TCP: every caller is anonymous.
    let rules = "[[access]]\nidentity = \"*\"\nnamespaces = [\"public\"]\nallow = [\"consume\"]\n\
                 [[access]]\nidentity = \"alice\"\nnamespaces = [\"public\", \"a\"]\nallow = [\"produce\", \"consume\"]\n";
    let srv = TestServer::start_full(TestDb::new(1), "", &format!("{FAST_ENGINE}{rules}")).await;
    let mut c = srv.client();
    assert!(c
        .try_dequeue(vec![topic_req("public", "t", 1)])
        .unwrap()
        .is_empty());
    whole_call_denied(c.try_dequeue(vec![topic_req("a", "t", 1)]));
    let r = c.try_enqueue(vec![item("public", "t", 0, b"x")]).unwrap();
    assert!(denied(&r[0].error), "consume does not grant produce");
    srv.stop().await;
}

/// Two hosts of a static cluster, each with one shard (h0: shard 0, h1: shard 1), speaking
/// mTLS to clients and to each other, host i under the access rules `rules[i]`.
async fn tls_cluster(rules: [&str; 2]) -> (TestDb, Vec<foqs::daemon::Running>) {
    tls_cluster_with(rules, false).await
}

/// [`tls_cluster`]; with `peer_ca`, the hosts' certificates come from their own CA
/// (`cluster.peer_ca_file`), not the clients'.
async fn tls_cluster_with(rules: [&str; 2], peer_ca: bool) -> (TestDb, Vec<foqs::daemon::Running>) {
    let dir = certs();
    let (host_cert, extra) = if peer_ca {
        (
            "peer-host",
            format!("peer_ca_file = \"{}\"\n", dir.join("peer-ca.pem").display()),
        )
    } else {
        ("host", String::new())
    };
    let db = TestDb::new(2);
    let ports = [free_port(), free_port()];
    let hosts: Vec<String> = (0..2)
        .map(|i| {
            format!(
                "[[cluster.hosts]]\nid = \"h{i}\"\naddr = \"127.0.0.1:{}\"\nshards = [{i}]\n",
                ports[i]
            )
        })
        .collect();
    let mut running = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let toml = format!(
            "[server]\nlisten = \"127.0.0.1:{}\"\nhost_id = \"h{i}\"\n{}\n{}\n{FAST_ENGINE}\n{}\n\
             [cluster]\nmanager = \"static\"\npeer_poll_ms = 50\ntls_ca_file = \"{}\"\n\
             tls_cert_file = \"{}\"\ntls_key_file = \"{}\"\n{extra}{}",
            port,
            server_tls(true),
            db.shards_toml(),
            rules[i],
            dir.join("ca.pem").display(),
            dir.join(format!("{host_cert}-{}.pem", i + 1)).display(),
            dir.join(format!("{host_cert}-{}.key", i + 1)).display(),
            hosts.join("")
        );
        let cfg = Config::from_toml(&toml).unwrap();
        running.push(
            foqs::daemon::start(&cfg, Arc::new(SystemClock))
                .await
                .unwrap(),
        );
    }
    (db, running)
}

/// Two hosts of a static cluster, each with one shard, speaking mTLS to clients and to
/// each other: an ack sent to host 1 for an item of host 2's shard is forwarded, and host 2
/// checks the namespace for the client host 1 acts for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_forward_over_tls_and_the_owner_checks_the_client() {
    let (_db, running) = tls_cluster([RULES, RULES]).await;
    let mut alice1 = tls_client(running[0].addr, Some("alice")).unwrap();
    let mut alice2 = tls_client(running[1].addr, Some("alice")).unwrap();
    let mut bob2 = tls_client(running[1].addr, Some("bob")).unwrap();
    // Items on host 2's shard (enqueued there; it has capacity).
    let xa = alice2.enqueue(vec![item("a", "t", 0, b"x")]).remove(0);
    let xb = bob2.enqueue(vec![item("b", "t", 0, b"y")]).remove(0);
    assert!(xa.starts_with("1:") && xb.starts_with("1:"), "{xa} {xb}");
    let r = alice1.ack(&[xa.clone(), xb.clone()]);
    assert!(
        r[0].error.is_none(),
        "forwarded over TLS and allowed: {:?}",
        r[0].error
    );
    assert!(
        denied(&r[1].error),
        "the owner checked alice: {:?}",
        r[1].error
    );
    assert_eq!(bob2.stats("b", "t").ready, Some(1), "bob's item untouched");

    // Every routed call names the client it acts for, and the owner checks that client
    // (issue 54; before, topicStats, peek, dequeue, getActiveTopics and the dead-letter
    // calls went as the peer, allowed everything). Here as host 1 would route them.
    let mut peer = tls_client(running[1].addr, Some("host-1")).unwrap();
    let stats_for = |c: &mut Client, who: &str| {
        c.call(|c| {
            c.topic_stats(foqs::thrift_gen::TopicStatsRequest {
                ns: Some("b".into()),
                topic: Some("t".into()),
                local_only: Some(true),
                forwarded_for: Some(who.into()),
            })
        })
    };
    whole_call_denied(stats_for(&mut peer, "alice"));
    assert_eq!(stats_for(&mut peer, "bob").unwrap().ready, Some(1));
    let routed_dequeue = |c: &mut Client, who: &str| {
        c.call(|c| {
            c.dequeue(foqs::thrift_gen::DequeueRequest {
                topics: Some(vec![topic_req("b", "t", 1)]),
                wait_ms: None,
                local_only: Some(true),
                forwarded_by: Some("h0".into()),
                forwarded_for: Some(who.into()),
            })
        })
    };
    whole_call_denied(routed_dequeue(&mut peer, "alice"));
    // Only a peer may name another client: alice cannot pass as bob.
    let msg = whole_call_denied(stats_for(&mut alice2, "bob"));
    assert!(msg.contains("forwarded_for"), "{msg}");
    assert_eq!(bob2.stats("b", "t").ready, Some(1), "bob's item untouched");
    for r in running {
        r.shutdown().await;
    }
}

/// TLS to MySQL: a private MariaDB that requires secure transport (`require_secure_transport
/// = ON`, certificates from `scripts/certs.sh`). foqsd serves a shard on it with `[[shards]]
/// tls` (the CA; a client certificate for an account that `REQUIRE X509`), and is refused
/// without TLS, or trusting another CA, with an error that says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_reach_mysql_over_tls_and_are_refused_without_it() {
    let dir = certs();
    let d = dir.clone();
    let db = tokio::task::spawn_blocking(move || {
        let f = |n: &str| d.join(n).display().to_string();
        let db = PrivateMariaDb::start_with(&[
            format!("--ssl-ca={}", f("ca.pem")),
            format!("--ssl-cert={}", f("server.pem")),
            format!("--ssl-key={}", f("server.key")),
        ]);
        db.sql(
            "CREATE USER 'x509'@'127.0.0.1' REQUIRE X509; \
             GRANT ALL PRIVILEGES ON `foqs%`.* TO 'x509'@'127.0.0.1'; \
             SET GLOBAL require_secure_transport = ON;",
        );
        db
    })
    .await
    .unwrap();
    let port = db.port;
    let cfg = |user: &str, tls: &str| {
        Config::from_toml(&format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n\
             [[shards]]\nid = 0\nurl = \"mysql://{user}@127.0.0.1:{port}/foqs_tls\"\n{tls}\n"
        ))
        .expect("config")
    };
    let ca = dir.join("ca.pem").display().to_string();
    let refused = |r: Result<foqs::daemon::Running, foqs::daemon::StartError>| match r {
        Ok(_) => panic!("foqsd served a shard it should not reach"),
        Err(e) => e.to_string(),
    };
    // Without TLS: the server's own refusal, named.
    let e = refused(foqs::daemon::start(&cfg("root", ""), Arc::new(SystemClock)).await);
    assert!(
        e.contains("Access denied") && e.contains("without TLS"),
        "{e}"
    );
    // Trusting another CA: the handshake fails on the server's certificate.
    let other = format!(
        "tls = {{ ca_file = \"{}\" }}",
        dir.join("other-ca.pem").display()
    );
    let e = refused(foqs::daemon::start(&cfg("root", &other), Arc::new(SystemClock)).await);
    assert!(
        e.to_lowercase().contains("certificate") || e.to_lowercase().contains("issuer"),
        "{e}"
    );
    // An account that requires a client certificate, without one: refused by the server.
    let only_ca = format!("tls = {{ ca_file = \"{ca}\" }}");
    let e = refused(foqs::daemon::start(&cfg("x509", &only_ca), Arc::new(SystemClock)).await);
    assert!(e.contains("Access denied"), "{e}");
    // With the CA (and, for that account, a client certificate): served.
    for (user, tls) in [
        ("root", only_ca.clone()),
        (
            "x509",
            format!(
                "tls = {{ ca_file = \"{ca}\", cert_file = \"{}\", key_file = \"{}\" }}",
                dir.join("rsa-db.pem").display(),
                dir.join("rsa-db.key").display()
            ),
        ),
    ] {
        let running = foqs::daemon::start(&cfg(user, &tls), Arc::new(SystemClock))
            .await
            .unwrap_or_else(|e| panic!("{user} over TLS: {e}"));
        let addr = running.addr;
        let got = tokio::task::spawn_blocking(move || {
            let mut c = Client::connect(addr, Proto::Binary);
            c.enqueue(vec![item("tls", user, 0, b"over tls")]);
            c.dequeue("tls", user, 1)
        })
        .await
        .unwrap();
        assert_eq!(got.len(), 1, "{user}: {got:?}");
        assert_eq!(got[0].payload.as_deref(), Some(&b"over tls"[..]));
        running.shutdown().await;
    }
    drop(db);
}

/// One TLS identity holds at most `server.connections_per_identity_max` connections,
/// from any addresses: past it its own oldest idle connection gives way, and another
/// identity's are untouched. (Before: only the global cap, which one identity could fill.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_identity_is_held_to_its_own_connection_cap() {
    let (_db, running) = tls_host(1, "connections_per_identity_max = 2\n", &server_tls(true)).await;
    let addr = running.addr;
    let mut bob = tls_client(addr, Some("bob")).unwrap();
    assert!(bob.host_info().shards.is_some());
    let mut first = tls_client(addr, Some("alice")).unwrap();
    assert!(first.host_info().shards.is_some());
    let mut second = tls_client(addr, Some("alice")).unwrap();
    assert!(second.host_info().shards.is_some());
    // A third alice connection: the first (idle longest) gives way.
    let mut third = tls_client(addr, Some("alice")).unwrap();
    assert!(third.host_info().shards.is_some());
    let gone = eventually(
        Duration::from_secs(5),
        "alice's first connection closed",
        || first.call(|c| c.get_host_info()).err(),
    )
    .await;
    assert!(matches!(gone, thrift::Error::Transport(_)), "{gone:?}");
    assert!(second.host_info().shards.is_some());
    assert!(
        bob.host_info().shards.is_some(),
        "another identity is untouched"
    );
    running.shutdown().await;
}

/// A dequeue routed to a peer names its client, and the peer applies its own rules to it:
/// here h1 lets alice produce in "a" but not consume, so her dequeue at h0 (whose rules let
/// her) gets nothing of h1's items. (Before: h0 routed it as itself, allowed everything,
/// and h1 handed the items out.) Bob's dequeue of "b" at h0, allowed on both, shows that
/// h0 routes to h1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routed_dequeue_is_checked_by_the_serving_hosts_rules() {
    let h1_rules = RULES.replacen(
        "identity = \"alice\"\nnamespaces = [\"a\"]\nallow = [\"produce\", \"consume\"]",
        "identity = \"alice\"\nnamespaces = [\"a\"]\nallow = [\"produce\"]",
        1,
    );
    assert_ne!(h1_rules, RULES);
    let (_db, running) = tls_cluster([RULES, &h1_rules]).await;
    let mut alice_h1 = tls_client(running[1].addr, Some("alice")).unwrap();
    let mut bob_h1 = tls_client(running[1].addr, Some("bob")).unwrap();
    let xa = alice_h1.enqueue(vec![item("a", "t", 0, b"x")]).remove(0);
    let xb = bob_h1.enqueue(vec![item("b", "t", 0, b"y")]).remove(0);
    assert!(xa.starts_with("1:") && xb.starts_with("1:"), "{xa} {xb}");
    let mut bob_h0 = tls_client(running[0].addr, Some("bob")).unwrap();
    let got = eventually(Duration::from_secs(10), "bob's item routed from h1", || {
        bob_h0.dequeue("b", "t", 1).pop()
    })
    .await;
    assert_eq!(got.id.as_deref(), Some(xb.as_str()));
    let mut alice_h0 = tls_client(running[0].addr, Some("alice")).unwrap();
    let mine = alice_h0
        .try_dequeue(vec![topic_req("a", "t", 1)])
        .unwrap_or_default();
    assert!(mine.is_empty(), "h1 handed alice's routed dequeue {mine:?}");
    // Still there, as h1 itself counts it.
    let mut peer = tls_client(running[1].addr, Some("host-1")).unwrap();
    let stats = peer
        .call(|c| {
            c.topic_stats(TopicStatsRequest {
                ns: Some("a".into()),
                topic: Some("t".into()),
                local_only: Some(true),
                forwarded_for: None,
            })
        })
        .unwrap();
    assert_eq!(stats.ready, Some(1));
    for r in running {
        r.shutdown().await;
    }
}

/// `server.tls.crl_file`: a client whose certificate its CA revoked is refused at the
/// handshake; the others are served. (Before: no revocation list could be given.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_client_certificate_is_refused() {
    let crl = format!(
        "crl_file = \"{}\"\nclient_ca_file",
        certs().join("crl.pem").display()
    );
    let tls = server_tls(true).replace("client_ca_file", &crl);
    let (_db, running) = tls_host(1, "", &tls).await;
    let addr = running.addr;
    assert!(tls_client(addr, Some("alice"))
        .unwrap()
        .host_info()
        .shards
        .is_some());
    let revoked = tls_client(addr, Some("revoked")).and_then(|mut c| c.call(|c| c.get_host_info()));
    assert!(revoked.is_err(), "a revoked certificate got through");
    running.shutdown().await;
}

/// With `cluster.peer_ca_file` a peer is known by its certificate's issuer: the hosts'
/// certificates of their own CA make them peers (an ack is forwarded), while a client
/// certificate of the clients' CA named like a host does not (its notifyReady is refused).
/// (Before: any client-CA certificate named "host-1" was a peer under the rule allowing
/// "host-1" peer.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_peer_ca_a_clients_certificate_named_like_a_host_is_no_peer() {
    let (_db, running) = tls_cluster_with([RULES, RULES], true).await;
    let mut alice1 = tls_client(running[0].addr, Some("alice")).unwrap();
    let mut alice2 = tls_client(running[1].addr, Some("alice")).unwrap();
    let xa = alice2.enqueue(vec![item("a", "t", 0, b"x")]).remove(0);
    assert!(xa.starts_with("1:"), "{xa}");
    let r = alice1.ack(std::slice::from_ref(&xa));
    assert!(
        r[0].error.is_none(),
        "forwarded between peers: {:?}",
        r[0].error
    );
    let mut posing = tls_client(running[1].addr, Some("host-1")).unwrap();
    let ready = NotifyReadyRequest {
        host_id: Some("h0".into()),
        topics: Some(vec![]),
    };
    whole_call_denied(posing.call(|c| c.notify_ready(ready)));
    for r in running {
        r.shutdown().await;
    }
}
