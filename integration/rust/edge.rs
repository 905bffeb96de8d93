//! The edge under a careless or hostile client: connections one client cannot exhaust,
//! deadlines on partial frames and idle connections (a long poll is not idleness), and
//! the metrics and health endpoints moving with known traffic.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;
use foqs::thrift_gen::*;

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_hoarding_connections_cannot_starve_a_new_one() {
    let srv = TestServer::start_full(
        TestDb::new(2),
        "",
        &format!("{FAST_ENGINE}[metrics]\nlisten = \"127.0.0.1:0\"\n"),
    )
    .await;
    let metrics = srv.running.as_ref().unwrap().metrics_addr.unwrap();
    let before_kib = rss_kib();
    // 1,100 connections that send nothing, then 100 stuck in half a frame (a length of
    // 1000 and two bytes), all from one careless client: more than the cap of 1,024.
    let hoard: Vec<TcpStream> = tokio::task::block_in_place(|| {
        let mut v = Vec::new();
        for i in 0..1_200 {
            let mut s = TcpStream::connect(srv.addr).unwrap();
            if i >= 1_100 {
                s.write_all(&[0x00, 0x00, 0x03, 0xe8, 0x80, 0x01]).unwrap();
            }
            v.push(s);
        }
        v
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A well-behaved client is served at once.
    let started = Instant::now();
    let mut c = srv.client();
    let info = c.host_info();
    let first = started.elapsed();
    assert_eq!(info.shards.unwrap().len(), 2);
    let id = c.enqueue(vec![item("edge", "hoard", 0, b"x")]).remove(0);
    let got = c.dequeue("edge", "hoard", 1);
    assert_eq!(got[0].id.as_deref(), Some(id.as_str()));
    assert!(c.ack(&[id])[0].error.is_none());
    let all = started.elapsed();
    let grown_kib = rss_kib().saturating_sub(before_kib);
    let (_, scrape) = http_get(metrics, "/metrics");
    let evicted = sample(&scrape, "foqs_connections_evicted_total");
    eprintln!(
        "with 1,100 idle and 100 half-frame connections: getHostInfo in {first:?}, \
         enqueue+dequeue+ack done in {all:?}; {evicted} connections evicted; \
         process RSS grew {grown_kib} KiB"
    );
    assert!(all < Duration::from_secs(2), "served in {all:?}");
    assert!(evicted >= 177.0, "{evicted} evicted");
    assert!(sample(&scrape, "foqs_connections_open") <= 1024.0);
    // 1,200 client and up to 1,024 server sockets and tasks: a few MiB, not a frame
    // buffer per connection.
    assert!(grown_kib < 64 * 1024, "RSS grew {grown_kib} KiB");
    drop(hoard);
    srv.stop().await;
}

/// True when the server closed `s` within its read timeout.
fn closed_by_server(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_frames_and_idle_connections_close_but_a_long_poll_does_not() {
    let srv = TestServer::start_full(
        TestDb::new(1),
        "frame_read_timeout_ms = 300\nidle_timeout_ms = 700",
        &format!("{FAST_ENGINE}[metrics]\nlisten = \"127.0.0.1:0\"\n"),
    )
    .await;
    let metrics = srv.running.as_ref().unwrap().metrics_addr.unwrap();
    tokio::task::block_in_place(|| {
        let start = Instant::now();
        let mut half = TcpStream::connect(srv.addr).unwrap();
        half.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        half.write_all(&[0x00, 0x00, 0x03, 0xe8, 0x80]).unwrap();
        assert!(closed_by_server(&mut half));
        let t = start.elapsed();
        assert!(
            t >= Duration::from_millis(250) && t < Duration::from_secs(2),
            "half frame closed after {t:?}"
        );

        let start = Instant::now();
        let mut idle = TcpStream::connect(srv.addr).unwrap();
        idle.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert!(closed_by_server(&mut idle));
        let t = start.elapsed();
        assert!(
            t >= Duration::from_millis(650) && t < Duration::from_secs(3),
            "idle connection closed after {t:?}"
        );
    });
    // A long poll of 1.5 s outlasts the idle deadline: it is a request in progress.
    let mut c = srv.client();
    let started = Instant::now();
    let got = c
        .try_dequeue_wait(vec![topic_req("edge", "quiet", 1)], Some(1_500))
        .expect("the long poll is answered");
    assert!(got.is_empty());
    assert!(started.elapsed() >= Duration::from_millis(1_400));
    // And the connection still works right after.
    assert_eq!(c.host_info().shards.unwrap().len(), 1);
    let (_, scrape) = http_get(metrics, "/metrics");
    assert!(
        sample(
            &scrape,
            "foqs_connections_closed_total{reason=\"frame_timeout\"}"
        ) >= 1.0
    );
    assert!(
        sample(
            &scrape,
            "foqs_connections_closed_total{reason=\"idle_timeout\"}"
        ) >= 1.0
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_health_follow_known_traffic_and_survive_a_restart() {
    let extra = format!("{FAST_ENGINE}[metrics]\nlisten = \"127.0.0.1:0\"\n");
    let srv = TestServer::start_full(TestDb::new(3), "", &extra).await;
    let metrics = srv.running.as_ref().unwrap().metrics_addr.unwrap();
    assert_eq!(http_get(metrics, "/healthz").0, 200);
    let (status, body) = http_get(metrics, "/readyz");
    assert_eq!(
        (status, body.trim()),
        (
            200,
            "ready: 3 of 3 shards healthy\nshard 0: serving\nshard 1: serving\nshard 2: serving"
        )
    );

    let mut c = srv.client();
    let later = now_ms() + 3_600_000;
    let mut items: Vec<EnqueueItem> = (0..8).map(|i| item("m1", "t", i, b"x")).collect();
    items.extend((0..2).map(|_| EnqueueItem {
        deliver_after_ms: Some(later),
        ..item("m1", "t", 0, b"later")
    }));
    c.enqueue(items);
    let got: Vec<String> = c
        .dequeue("m1", "t", 5)
        .into_iter()
        .map(|i| i.id.unwrap())
        .collect();
    assert_eq!(got.len(), 5);
    assert!(c.ack(&got[..3]).iter().all(|r| r.error.is_none()));
    let r = c.nack(vec![
        nack(&got[3], None, None),
        NackItem {
            to_dlq: Some(true),
            ..nack(&got[4], None, None)
        },
    ]);
    assert!(r.iter().all(|r| r.error.is_none()), "{r:?}");
    let _ = c.try_peek("m1", "t", 0); // INVALID_ARGUMENT: counted by code
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let (_, scrape) = http_get(metrics, "/metrics");
    let expect = [
        ("foqs_items_enqueued_total{ns=\"m1\"}", 10.0),
        ("foqs_items_delivered_total{ns=\"m1\"}", 5.0),
        ("foqs_items_acked_total{ns=\"m1\"}", 3.0),
        ("foqs_items_nacked_total{ns=\"m1\"}", 2.0),
        ("foqs_items_dead_lettered_total{ns=\"m1\"}", 1.0),
        ("foqs_items{ns=\"m1\",state=\"ready\"}", 4.0),
        ("foqs_items{ns=\"m1\",state=\"deferred\"}", 2.0),
        ("foqs_items{ns=\"m1\",state=\"leased\"}", 0.0),
        ("foqs_items{ns=\"m1\",state=\"dead\"}", 1.0),
        ("foqs_requests_total{method=\"enqueue\",code=\"ok\"}", 1.0),
        ("foqs_requests_total{method=\"dequeue\",code=\"ok\"}", 1.0),
        ("foqs_requests_total{method=\"ack\",code=\"ok\"}", 1.0),
        (
            "foqs_requests_total{method=\"peek\",code=\"INVALID_ARGUMENT\"}",
            1.0,
        ),
        ("foqs_request_duration_seconds_count{method=\"nack\"}", 1.0),
        ("foqs_shards_owned", 3.0),
        ("foqs_shard_breaker_open{shard=\"0\"}", 0.0),
        ("foqs_store_errors_total{shard=\"1\"}", 0.0),
    ];
    for (series, want) in expect {
        assert_eq!(sample(&scrape, series), want, "{series} in\n{scrape}");
    }
    let age = sample(&scrape, "foqs_oldest_ready_age_seconds{ns=\"m1\"}");
    assert!((1.0..60.0).contains(&age), "oldest ready age {age}");
    assert!(
        sample(
            &scrape,
            "foqs_store_operation_duration_seconds_count{shard=\"0\"}"
        ) > 0.0
    );
    assert!(!scrape.contains("topic="), "no topic label, ever");

    // The depth gauges are counted afresh from storage at start-up.
    let db = srv.stop().await;
    let srv = TestServer::start_full(db, "", &extra).await;
    let metrics = srv.running.as_ref().unwrap().metrics_addr.unwrap();
    let (_, scrape) = http_get(metrics, "/metrics");
    for (series, want) in [
        ("foqs_items{ns=\"m1\",state=\"ready\"}", 4.0),
        ("foqs_items{ns=\"m1\",state=\"deferred\"}", 2.0),
        ("foqs_items{ns=\"m1\",state=\"dead\"}", 1.0),
    ] {
        assert_eq!(sample(&scrape, series), want, "{series} after a restart");
    }
    srv.stop().await;
}
