//! Hosts whose clocks disagree, owning a shard in turn: what one host wrote in its clock
//! (the scan's checkpoint, lease ends, due times) must not strand items or break leases
//! when a host whose clock is behind takes the shard over. Driven with manual clocks, so
//! each case is exact.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use foqs::clock::ManualClock;
use foqs::thrift_gen::*;

const NS: &str = "skew";
const T0: i64 = 1_000_000_000_000;

/// Sets the scan checkpoint a shard's last owner saved, as a host whose clock ran ahead
/// leaves it: every event up to `ms` of its clock processed (promoted into its own index,
/// which died with it).
fn save_checkpoint(db: &TestDb, ms: i64) {
    let file = foqs::store::sqlite_path(&db.url(0), std::path::Path::new("/")).unwrap();
    let conn = rusqlite::Connection::open(file).unwrap();
    conn.execute(
        "UPDATE foqs_meta SET value = ?1 WHERE name = 'checkpoint_ms'",
        [ms],
    )
    .unwrap();
}

/// A shard taken over from a host whose clock ran 2 s ahead: its checkpoint is in the new
/// owner's future. An item that comes due in between is delivered when it comes due by
/// the new owner's clock. (Before: the new owner's scan started at the checkpoint and
/// never promoted it; `getActiveTopics` counted it ready and no dequeue returned it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_due_before_a_fast_owners_checkpoint_is_delivered() {
    let clock = ManualClock::new(T0);
    let srv =
        TestServer::start_with_clock(TestDb::sqlite(1), "", "", Arc::new(clock.clone())).await;
    let mut c = srv.client();
    let ids = c.enqueue(vec![
        EnqueueItem {
            deliver_after_ms: Some(T0 + 1_000),
            ..item(NS, "t", 0, b"x")
        },
        item(NS, "t", 5, b"y"),
    ]);
    let db = srv.stop().await;
    save_checkpoint(&db, T0 + 2_000);

    let srv = TestServer::start_with_clock(db, "", "", Arc::new(clock.clone())).await;
    let mut c = srv.client();
    // Only y is due: the topic's ready items are read whole (the index holds them all,
    // and learns of later ones from the scan).
    let y = c.dequeue(NS, "t", 10);
    assert_eq!(y.len(), 1);
    assert_eq!(y[0].id, Some(ids[1].clone()));
    clock.advance(1_500);
    let got = eventually(Duration::from_secs(10), "the item delivered", || {
        c.dequeue(NS, "t", 1).pop()
    })
    .await;
    assert_eq!(got.id, Some(ids[0].clone()));
    srv.stop().await;
}

/// An item a host whose clock ran 2 s ahead wrote as ready now (no timer: due at once by
/// its clock) is delivered by the next owner once it is due by the next owner's clock,
/// even after the next owner read the topic's ready items whole. (Before: nothing would
/// ever tell the next owner's index of it, while the counts, and getActiveTopics, called
/// it ready: stranded.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_a_fast_host_wrote_ready_is_delivered_when_due_by_the_next_owner() {
    let fast = ManualClock::new(T0 + 2_000);
    let srv = TestServer::start_with_clock(TestDb::sqlite(1), "", "", Arc::new(fast)).await;
    let x = srv.client().enqueue(vec![item(NS, "t", 0, b"x")]).remove(0);
    let db = srv.stop().await;

    let clock = ManualClock::new(T0);
    let srv = TestServer::start_with_clock(db, "", "", Arc::new(clock.clone())).await;
    let mut c = srv.client();
    let y = c.enqueue(vec![item(NS, "t", 5, b"y")]).remove(0);
    // Only y is due: the topic's ready items are read whole.
    let got = c.dequeue(NS, "t", 10);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].id, Some(y));
    clock.advance(2_500);
    let got = eventually(Duration::from_secs(10), "x delivered", || {
        c.dequeue(NS, "t", 10).pop()
    })
    .await;
    assert_eq!(got.id, Some(x));
    srv.stop().await;
}
