//! One writer per shard: a second foqsd on the same shards serves none of them and says
//! why; once the first is killed with SIGKILL, the second starts and serves everything.
//! A process that loses a shard's owner lock stops writing it and takes it back when the
//! lock is free again.

use crate::common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use mysql_async::prelude::*;

const NS: &str = "owner";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_foqsd_on_the_same_shards_refuses_until_the_first_is_killed() {
    let db = TestDb::new(2);
    let config = write_config(&db, &config_toml(&db, "", FAST_ENGINE));
    let mut first = Proc::spawn(&config, &[]);
    let mut c = Client::connect(first.addr, Proto::Binary);
    let ids = c.enqueue((0..20).map(|i| item(NS, "t", i, b"x")).collect());

    // A copy-pasted start on another port: refused, naming the shard and the reason.
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_foqsd"))
        .args(["--config", config.to_str().unwrap(), "--listen"])
        .arg(format!("127.0.0.1:{}", free_port()))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("run a second foqsd");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the second foqsd started: {stderr}");
    assert!(
        stderr.contains("is served by another foqsd process") && stderr.contains("shard "),
        "{stderr}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    // The first one never noticed.
    let got = c.dequeue(NS, "t", 5);
    assert_eq!(got.len(), 5);
    let acked: Vec<String> = got.into_iter().map(|i| i.id.unwrap()).collect();
    assert!(c.ack(&acked).iter().all(|r| r.error.is_none()));

    // SIGKILL frees the shards at once: the second one starts and has every item.
    first.sigkill();
    let second = Proc::spawn(&config, &[]);
    let mut c = Client::connect(second.addr, Proto::Binary);
    let info = c.host_info();
    assert_eq!(info.shards.unwrap().len(), 2);
    let rest = eventually(Duration::from_secs(5), "the other 15 items", || {
        let got = c.dequeue(NS, "t", 20);
        (got.len() == 15).then_some(got)
    })
    .await;
    let mut all: Vec<String> = rest.into_iter().map(|i| i.id.unwrap()).collect();
    all.extend(acked);
    all.sort();
    let mut ids = ids;
    ids.sort();
    assert_eq!(all, ids);
    let _ = std::fs::remove_dir_all(config.parent().unwrap());
}

/// The MySQL connection id holding a shard's owner lock, if any.
async fn lock_holder(conn: &mut mysql_async::Conn, database: &str) -> Option<u64> {
    let name = format!("foqs_shard_{database}");
    conn.exec_first::<Option<u64>, _, _>("SELECT IS_USED_LOCK(?)", (name,))
        .await
        .unwrap()
        .flatten()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_owner_lock_stops_the_writes_until_the_lock_is_free_again() {
    let srv = TestServer::start(1, "").await;
    let mut c = srv.client();
    c.enqueue(vec![item(NS, "lost", 0, b"before")]);
    let database = srv.db.names[0].clone();
    let mut admin = mysql_async::Conn::from_url(mysql_base()).await.unwrap();
    let holder = lock_holder(&mut admin, &database)
        .await
        .expect("foqsd holds the lock");

    // Someone else takes the lock the moment foqsd's lock connection dies.
    let mut thief = mysql_async::Conn::from_url(mysql_base()).await.unwrap();
    admin
        .query_drop(format!("KILL CONNECTION {holder}"))
        .await
        .unwrap();
    let name = format!("foqs_shard_{database}");
    let got: Option<i64> = thief
        .exec_first("SELECT GET_LOCK(?, 5)", (&name,))
        .await
        .unwrap();
    assert_eq!(got, Some(1));
    // foqsd notices within its check interval and stops serving the shard.
    eventually(Duration::from_secs(5), "the shard dropped", || {
        c.host_info().shards.unwrap().is_empty().then_some(())
    })
    .await;
    let r = c.try_enqueue(vec![item(NS, "lost", 0, b"during")]).unwrap();
    let e = r[0].error.as_ref().expect("no shard to write to");
    assert_eq!(
        e.code,
        Some(foqs::thrift_gen::ErrorCode::UNAVAILABLE),
        "{e:?}"
    );

    // The lock is free again: foqsd opens the shard afresh and serves what it holds.
    thief
        .query_drop(format!("DO RELEASE_LOCK('{name}')"))
        .await
        .unwrap();
    eventually(Duration::from_secs(5), "the shard back", || {
        (c.host_info().shards.unwrap().len() == 1).then_some(())
    })
    .await;
    let items = c.dequeue(NS, "lost", 10);
    assert_eq!(items.len(), 1);
    assert_eq!(items[0].payload.as_deref(), Some(&b"before"[..]));
    let new_holder = lock_holder(&mut admin, &database).await;
    assert!(new_holder.is_some() && new_holder != Some(holder));
    let _ = thief.disconnect().await;
    let _ = admin.disconnect().await;
    srv.stop().await;
}
