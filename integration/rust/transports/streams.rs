//! Unframed pipelining, Thrift over HTTP, the Rust client over every transport, and the
//! frame deadline for a request that stalls halfway.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unframed_calls_of_strict_and_non_strict_writers_pipelined_in_one_packet() {
    let srv = server().await;
    let mut s = raw(srv.addr);
    tokio::task::block_in_place(|| {
        let info = |seq| {
            call(false, "getHostInfo", seq, |o| {
                FoqsGetHostInfoArgs {}.write_to_out_protocol(o)
            })
        };
        // A non-strict writer: the name's length first, no version.
        let mut non_strict = 11u32.to_be_bytes().to_vec();
        non_strict.extend_from_slice(b"getHostInfo");
        non_strict.push(1);
        non_strict.extend_from_slice(&2i32.to_be_bytes());
        non_strict.push(0);
        let mut packet = info(1);
        packet.extend_from_slice(&non_strict);
        packet.extend_from_slice(&info(3));
        s.write_all(&packet).unwrap();
        // Three replies, in order, unframed: read them back to back.
        let mut all = Vec::new();
        loop {
            let mut b = [0u8; 4096];
            let n = s.read(&mut b).unwrap();
            assert!(n > 0);
            all.extend_from_slice(&b[..n]);
            let mut i = TBinaryInputProtocol::new(&all[..], true);
            let mut seqs = Vec::new();
            let done = (0..3).all(|_| {
                let Ok(ident) = i.read_message_begin() else {
                    return false;
                };
                seqs.push(ident.sequence_number);
                FoqsGetHostInfoResult::read_from_in_protocol(&mut i).is_ok()
            });
            if done {
                assert_eq!(seqs, vec![1, 2, 3], "answered in order");
                return;
            }
        }
    });
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thrift_over_http_keeps_the_connection_alive_and_answers_100_continue() {
    let srv = server().await;
    let mut s = raw(srv.addr);
    let info = call(false, "getHostInfo", 5, |o| {
        FoqsGetHostInfoArgs {}.write_to_out_protocol(o)
    });
    tokio::task::block_in_place(|| {
        for round in 0..2 {
            let expect = if round == 1 {
                "Expect: 100-continue\r\n"
            } else {
                ""
            };
            let head = format!(
                "POST /foqs HTTP/1.1\r\nHost: foqs\r\nContent-Type: application/x-thrift\r\n{expect}Content-Length: {}\r\n\r\n",
                info.len()
            );
            s.write_all(head.as_bytes()).unwrap();
            if round == 1 {
                let mut cont = [0u8; 25];
                s.read_exact(&mut cont).unwrap();
                assert_eq!(&cont, b"HTTP/1.1 100 Continue\r\n\r\n");
            }
            s.write_all(&info).unwrap();
            let mut got = Vec::new();
            let body = loop {
                let mut b = [0u8; 4096];
                let n = s.read(&mut b).unwrap();
                assert!(n > 0, "round {round}: the connection stays open");
                got.extend_from_slice(&b[..n]);
                let text = String::from_utf8_lossy(&got).to_string();
                if let Some((head, _)) = text.split_once("\r\n\r\n") {
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("Content-Length: "))
                        .unwrap()
                        .parse()
                        .unwrap();
                    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
                    assert!(
                        head.contains("Content-Type: application/x-thrift"),
                        "{head}"
                    );
                    let at = head.len() + 4;
                    if got.len() >= at + len {
                        break got[at..at + len].to_vec();
                    }
                }
            };
            let mut i = TBinaryInputProtocol::new(&body[..], true);
            let ident = i.read_message_begin().unwrap();
            assert_eq!(
                (ident.message_type, ident.sequence_number),
                (TMessageType::Reply, 5)
            );
            assert!(FoqsGetHostInfoResult::read_from_in_protocol(&mut i).is_ok());
        }
    });
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_client_over_every_transport_shares_one_queue_and_the_metrics_count_them() {
    let srv = server().await;
    let metrics = srv.running.as_ref().unwrap().metrics_addr.unwrap();
    let transports = [
        ClientTransport::Framed,
        ClientTransport::Unframed,
        ClientTransport::Header { zlib: false },
        ClientTransport::Header { zlib: true },
    ];
    for (n, t) in transports.into_iter().enumerate() {
        for proto in [Proto::Binary, Proto::Compact] {
            let topic = format!("t{n}-{proto:?}");
            let mut c = Client::from_sync(
                connect_via(srv.addr, proto, t, Duration::from_secs(10)).expect("connect"),
            );
            let ids = c.enqueue(vec![
                item("all", &topic, 9, b"b"),
                item("all", &topic, 2, b"a"),
            ]);
            let got = c.dequeue("all", &topic, 5);
            let payloads: Vec<_> = got.iter().map(|i| i.payload.clone().unwrap()).collect();
            assert_eq!(
                payloads,
                vec![b"a".to_vec(), b"b".to_vec()],
                "{t:?} {proto:?}"
            );
            assert!(c.ack(&ids).iter().all(|r| r.error.is_none()));
        }
    }
    let (_, scrape) = tokio::task::block_in_place(|| http_get(metrics, "/metrics"));
    for (transport, protocol) in [
        ("framed", "binary"),
        ("unframed", "compact"),
        ("header", "compact"),
    ] {
        let series = format!(
            "foqs_transport_requests_total{{transport=\"{transport}\",protocol=\"{protocol}\"}}"
        );
        assert!(sample(&scrape, &series) >= 3.0, "{series}");
    }
    for transport in ["framed", "unframed", "header"] {
        let series = format!("foqs_transport_connections_total{{transport=\"{transport}\"}}");
        assert!(sample(&scrape, &series) >= 2.0, "{series}");
    }
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_stalls_halfway_is_closed_at_the_frame_deadline_in_every_transport() {
    let srv = TestServer::start_full(
        TestDb::new(1),
        "frame_read_timeout_ms = 300\nidle_timeout_ms = 60000",
        "",
    )
    .await;
    let info = call(false, "getHostInfo", 1, |o| {
        FoqsGetHostInfoArgs {}.write_to_out_protocol(o)
    });
    let header = fb_frame(0, &[], &info);
    let post = format!(
        "POST / HTTP/1.1\r\nContent-Type: application/x-thrift\r\nContent-Length: {}\r\n\r\n",
        info.len()
    )
    .into_bytes();
    let halves: Vec<(&str, Vec<u8>)> = vec![
        ("unframed", info[..info.len() / 2].to_vec()),
        (
            "framed",
            [&(info.len() as u32).to_be_bytes()[..], &info[..3]].concat(),
        ),
        ("header", header[..header.len() - 3].to_vec()),
        ("http head", post[..post.len() - 4].to_vec()),
        ("http body", [&post[..], &info[..2]].concat()),
    ];
    tokio::task::block_in_place(|| {
        for (what, half) in halves {
            let started = Instant::now();
            let mut s = raw(srv.addr);
            s.write_all(&half).unwrap();
            let (_, closed) = read_answer(&mut s, Duration::from_secs(5));
            let took = started.elapsed();
            assert!(closed, "{what}: closed");
            assert!(
                took >= Duration::from_millis(250) && took < Duration::from_secs(3),
                "{what}: closed at the 300 ms deadline, took {took:?}"
            );
        }
    });
    srv.stop().await;
}
