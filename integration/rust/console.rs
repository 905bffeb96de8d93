//! The web console in a real browser: Debian's headless Chromium driven through
//! chromedriver (WebDriver), against a foqsd with known items. Figures shown are checked
//! against the Thrift API (topicStats, peek), and every button's effect through it too.
//! On failure a screenshot is saved under .run/ (console-failure.png); the overview and a
//! topic page are saved there on every run (console-overview.png, console-topic.png).

use crate::common;

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use fantoccini::{Client as Browser, ClientBuilder, Locator};
use futures::FutureExt;

const NS: &str = "shop";
const MANY: &str = "many";
const MANY_TOPICS: usize = 2_500;
const XSS: &str = "<script>document.title='pwned'</script><b>bold</b>";

mod browser;
use browser::*;
// The console's own (async steps, seconds), not common's.
use browser::eventually;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_in_a_real_browser() {
    // Cheap hashes: the test checks the logic, not Argon2's cost.
    let admin_hash = foqs::console::hash_password("admin-pw", 64, 1).unwrap();
    let viewer_hash = foqs::console::hash_password("viewer-pw", 64, 1).unwrap();
    let extra = format!(
        "[console]\nlisten = \"127.0.0.1:0\"\nrefresh_ms = 400\n\
         [[console.users]]\nname = \"admin\"\npassword_hash = \"{admin_hash}\"\n\
         [[console.users]]\nname = \"viewer\"\npassword_hash = \"{viewer_hash}\"\nrole = \"read-only\"\n"
    );
    let srv = TestServer::start(3, &extra).await;
    let web = srv
        .running
        .as_ref()
        .unwrap()
        .console_addr
        .expect("console listens");
    let mut c = srv.client();

    // Known items: 30 ready and 5 deferred in "orders" (3 of them then leased), one with
    // a hostile payload, 12 dead letters, and 2,500 topics of one item each.
    // Leases of 10 minutes: the 3 leased must stay leased through the whole test, which a
    // loaded machine stretched past the default 30 s once ("looking leased nothing" saw
    // them back to ready).
    let mut orders: Vec<_> = (0..30)
        .map(|i| foqs::thrift_gen::EnqueueItem {
            lease_ms: Some(600_000),
            ..item(NS, "orders", (i * 7) % 30, format!("order {i}").as_bytes())
        })
        .collect();
    for i in 0..5 {
        let mut it = item(NS, "orders", 1, format!("later {i}").as_bytes());
        it.deliver_after_ms =
            Some(foqs::clock::Clock::now_ms(&foqs::clock::SystemClock) + 3_600_000);
        orders.push(it);
    }
    c.enqueue(orders);
    let leased = c.dequeue(NS, "orders", 3);
    assert_eq!(leased.len(), 3);
    c.enqueue(vec![item(NS, "xss", 0, XSS.as_bytes())]);
    c.enqueue((0..12).map(|i| item(NS, "dead", i, b"doomed")).collect());
    let doomed = c.dequeue(NS, "dead", 12);
    c.nack(
        doomed
            .iter()
            .map(|i| to_dlq(i.id.as_deref().unwrap()))
            .collect(),
    );
    let many: Vec<String> = (0..MANY_TOPICS).map(|i| format!("t-{i:05}")).collect();
    for chunk in many.chunks(500) {
        c.enqueue(chunk.iter().map(|t| item(MANY, t, 0, b"x")).collect());
    }
    let shop_topics: Vec<String> = ["orders", "xss", "dead"].map(String::from).to_vec();
    // A topic name that must be encoded in every link.
    const ODD: &str = "a/b%c d?e#f";
    c.enqueue(vec![item("odd", ODD, 0, b"odd one")]);

    let driver = chromedriver();
    let b = browser(&driver).await;
    let base = format!("http://{web}");
    let logged_in = format!("http://admin:admin-pw@{web}");
    let body = async {
        // --- overview: the figures are topicStats' -------------------------------------
        b.goto(&format!("{logged_in}/")).await.unwrap();
        let mut want = stats_sum(&mut c, NS, &shop_topics);
        let many_sum = stats_sum(&mut c, MANY, &many);
        let odd_sum = stats_sum(&mut c, "odd", &[ODD.to_string()]);
        for i in 0..4 {
            want[i] += many_sum[i] + odd_sum[i];
        }
        assert_eq!(
            want,
            [27 + 1 + 2_500 + 1, 5, 3, 12],
            "topicStats of the known items"
        );
        eventually(10, "overview figures equal topicStats", || async {
            let shown = cards(&b).await;
            if shown != want {
                eprintln!("overview shows {shown:?}, topicStats says {want:?}");
            }
            shown == want
        })
        .await;
        // The chart drew (uPlot ran under the CSP) from the series API.
        b.wait()
            .at_most(Duration::from_secs(10))
            .for_element(Locator::Css("#chart .uplot canvas"))
            .await
            .expect("the rates chart is drawn");
        std::fs::write(
            run_dir().join("console-overview.png"),
            b.screenshot().await.unwrap(),
        )
        .unwrap();

        // Live refresh without a reload, then none while paused.
        c.enqueue(vec![item(NS, "orders", 5, b"one more")]);
        want[0] += 1;
        eventually(10, "the overview refreshes by itself", || async {
            cards(&b).await == want
        })
        .await;
        click(&b, "#pause").await;
        settled(&b).await;
        c.enqueue(vec![item(NS, "orders", 5, b"while paused")]);
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        assert_eq!(cards(&b).await, want, "a paused page does not refresh");
        click(&b, "#pause").await;
        want[0] += 1;
        eventually(10, "refresh resumes", || async { cards(&b).await == want }).await;
        // None while the tab is hidden (as the browser says it is), and at once when it
        // shows again.
        b.execute(
            "Object.defineProperty(document, 'hidden', {configurable: true, get: () => true});",
            vec![],
        )
        .await
        .unwrap();
        settled(&b).await;
        c.enqueue(vec![item(NS, "orders", 5, b"while hidden")]);
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        assert_eq!(cards(&b).await, want, "a hidden tab does not refresh");
        b.execute(
            "Object.defineProperty(document, 'hidden', {configurable: true, get: () => false});
             document.dispatchEvent(new Event('visibilitychange'));",
            vec![],
        )
        .await
        .unwrap();
        want[0] += 1;
        eventually(3, "a tab shown again refreshes", || async {
            cards(&b).await == want
        })
        .await;

        // --- namespaces: shop's row is topicStats' over its topics --------------------
        b.goto(&format!("{base}/namespaces")).await.unwrap();
        let shop = stats_sum(&mut c, NS, &shop_topics);
        let cells = texts(&b, "#namespaces tbody tr[data-ns='shop'] td").await;
        let shown: Vec<i64> = cells[3..7].iter().map(|s| s.parse().unwrap()).collect();
        assert_eq!(shown, shop.to_vec(), "namespace row {cells:?}");
        assert_eq!(cells[2], "3", "shop has 3 topics");

        // --- 2,500 topics, paged; a filter ----------------------------------------------
        let t = Instant::now();
        b.goto(&format!("{base}/ns/{MANY}?limit=500"))
            .await
            .unwrap();
        let mut seen = Vec::new();
        for page in 0..5 {
            let range = text(&b, "#range").await;
            assert!(range.ends_with("of 2500 topics"), "page {page}: {range}");
            seen.extend(texts(&b, "#topics tbody td:first-child a").await);
            if page < 4 {
                click(&b, "#next").await;
                let want = format!("{}–", (page + 1) * 500 + 1);
                eventually(10, "the next page", || async {
                    text(&b, "#range").await.starts_with(&want)
                })
                .await;
            }
        }
        println!("paged through {} topics in {:?}", seen.len(), t.elapsed());
        assert!(!exists(&b, "#next").await, "the last page has no next");
        assert_eq!(seen.len(), MANY_TOPICS);
        assert_eq!(
            seen.iter().collect::<HashSet<_>>().len(),
            MANY_TOPICS,
            "no topic twice"
        );
        assert_eq!(seen, many, "every topic, by name");
        b.goto(&format!("{base}/ns/{MANY}?q=t-0042")).await.unwrap();
        let names = texts(&b, "#topics tbody td:first-child a").await;
        assert_eq!(
            names,
            (420..430).map(|i| format!("t-{i:05}")).collect::<Vec<_>>()
        );

        // Past the end: the last page.
        b.goto(&format!("{base}/ns/{MANY}?offset=18446744073709551615"))
            .await
            .unwrap();
        assert_eq!(text(&b, "#range").await, "2451–2500 of 2500 topics");

        // A name with '/', '%', ' ', '?' and '#' is reached through its link.
        b.goto(&format!("{base}/ns/odd")).await.unwrap();
        click(&b, "#topics tbody td:first-child a").await;
        assert_eq!(text(&b, "h1").await, ODD);
        assert_eq!(text(&b, "#next pre.preview").await, "odd one");

        // --- a topic's peek leases nothing ----------------------------------------------
        let before = c.stats(NS, "orders");
        b.goto(&format!("{base}/ns/{NS}/t/orders")).await.unwrap();
        text(&b, "#next tbody").await;
        let shown = attrs(&b, "#next tbody tr", "data-id").await;
        let peeked: Vec<String> = c
            .try_peek(NS, "orders", 20)
            .unwrap()
            .into_iter()
            .map(|i| i.id.unwrap())
            .collect();
        assert_eq!(shown, peeked, "the page shows peek's items, in its order");
        assert_eq!(
            number(&b, "#items [data-state=leased] .value").await,
            before.leased.unwrap()
        );
        std::fs::write(
            run_dir().join("console-topic.png"),
            b.screenshot().await.unwrap(),
        )
        .unwrap();
        tokio::time::sleep(Duration::from_millis(1_000)).await; // a few refreshes
        let after = c.stats(NS, "orders");
        assert_eq!(
            (after.ready, after.leased, after.delivered),
            (before.ready, before.leased, before.delivered),
            "looking leased nothing"
        );

        // A test item through the form.
        b.find(Locator::Css("#enqueue input[name=payload]"))
            .await
            .unwrap()
            .send_keys("from the form")
            .await
            .unwrap();
        b.find(Locator::Css("#enqueue input[name=priority]"))
            .await
            .unwrap()
            .clear()
            .await
            .unwrap();
        b.find(Locator::Css("#enqueue input[name=priority]"))
            .await
            .unwrap()
            .send_keys("-5")
            .await
            .unwrap();
        click(&b, "#enqueue button").await;
        assert!(text(&b, "#msg").await.starts_with("Enqueued "));
        let head = c.try_peek(NS, "orders", 1).unwrap();
        assert_eq!(head[0].payload.as_deref(), Some(&b"from the form"[..]));
        assert_eq!(head[0].priority, Some(-5));

        // --- a hostile payload is text ---------------------------------------------------
        b.goto(&format!("{base}/ns/{NS}/t/xss")).await.unwrap();
        assert_eq!(text(&b, "#next pre.preview").await, XSS);
        assert!(
            !exists(&b, "#next pre.preview b").await,
            "no <b> element made"
        );
        let source = b.source().await.unwrap();
        assert!(
            source.contains(
                "&lt;script&gt;document.title='pwned'&lt;/script&gt;&lt;b&gt;bold&lt;/b&gt;"
            ),
            "the payload is escaped in the HTML"
        );

        // --- dead letters: paged, requeue one, purge refused then confirmed, requeue all --
        b.goto(&format!("{base}/ns/{NS}/t/dead/dlq?limit=5"))
            .await
            .unwrap();
        let mut dead_seen = Vec::new();
        loop {
            text(&b, "#dead tbody tr").await;
            dead_seen.extend(attrs(&b, "#dead tbody tr", "data-id").await);
            if !exists(&b, "#next").await {
                break;
            }
            click(&b, "#next").await;
        }
        let mut all_dead: Vec<String> = doomed.iter().map(|i| i.id.clone().unwrap()).collect();
        all_dead.sort();
        let mut sorted_seen = dead_seen.clone();
        sorted_seen.sort();
        assert_eq!(
            sorted_seen, all_dead,
            "three pages of five hold the 12 dead letters"
        );
        b.goto(&format!("{base}/ns/{NS}/t/dead/dlq")).await.unwrap();
        let first = b.find(Locator::Css("#dead tbody tr")).await.unwrap();
        let first_id = first.attr("data-id").await.unwrap().unwrap();
        first
            .find(Locator::Css("button.requeue"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        assert_eq!(text(&b, "#msg").await, format!("Requeued {first_id}."));
        let st = c.stats(NS, "dead");
        assert_eq!(
            (st.dead, st.ready),
            (Some(11), Some(1)),
            "requeued through the button"
        );

        click(&b, "#purge button").await;
        assert!(text(&b, "#error")
            .await
            .contains("type the topic's exact name"));
        b.back().await.unwrap();
        b.find(Locator::Css("#purge input[name=confirm]"))
            .await
            .unwrap()
            .send_keys("deaf")
            .await
            .unwrap();
        click(&b, "#purge button").await;
        assert!(text(&b, "#error").await.contains("Nothing was deleted"));
        assert_eq!(
            c.stats(NS, "dead").dead,
            Some(11),
            "no purge without the confirmation"
        );
        b.goto(&format!("{base}/ns/{NS}/t/dead/dlq")).await.unwrap();
        b.find(Locator::Css("#purge input[name=confirm]"))
            .await
            .unwrap()
            .send_keys("dead")
            .await
            .unwrap();
        click(&b, "#purge button").await;
        assert_eq!(text(&b, "#msg").await, "Purged 11 dead items.");
        let st = c.stats(NS, "dead");
        assert_eq!((st.dead, st.ready), (Some(0), Some(1)));

        let again = c.dequeue(NS, "dead", 1);
        c.enqueue((0..3).map(|i| item(NS, "dead", i, b"again")).collect());
        let more = c.dequeue(NS, "dead", 3);
        c.nack(
            again
                .iter()
                .chain(&more)
                .map(|i| to_dlq(i.id.as_deref().unwrap()))
                .collect(),
        );
        b.goto(&format!("{base}/ns/{NS}/t/dead/dlq")).await.unwrap();
        click(&b, "#requeue-all button").await;
        assert_eq!(text(&b, "#msg").await, "Requeued 4 dead items.");
        let st = c.stats(NS, "dead");
        assert_eq!((st.dead, st.ready), (Some(0), Some(4)));
        assert!(!exists(&b, "#purge").await, "nothing left to purge");

        // --- who may: basic auth, the read-only role, the origin rule --------------------
        assert_eq!(http(web, "GET", "/", &[], "").0, 401, "no credentials");
        assert_eq!(
            http(web, "GET", "/", &[&basic("admin", "nope")], "").0,
            401,
            "a wrong password"
        );
        assert_eq!(
            http(
                web,
                "GET",
                "/api/v1/overview",
                &[&basic("viewer", "admin-pw")],
                ""
            )
            .0,
            401,
            "another user's password"
        );
        assert_eq!(
            http(web, "GET", "/", &[&basic("viewer", "viewer-pw")], "").0,
            200
        );
        let (code, body) = http(
            web,
            "GET",
            "/",
            &[&basic("admin", "admin-pw"), "Host: rebind.evil:9190"],
            "",
        );
        assert_eq!(code, 421, "a host name that may be re-pointed here: {body}");
        let (code, body) = http(web, "GET", "/api/v1/overview", &[], "");
        assert_eq!(code, 401);
        assert!(
            body.contains(r#""code":"Unauthorized""#),
            "API refusals are JSON: {body}"
        );
        let admin = basic("admin", "admin-pw");
        let (code, body) = http(web, "GET", "/api/v1/nope", &[&admin], "");
        assert_eq!(code, 404);
        assert!(body.contains(r#""code":"NotFound""#), "{body}");
        // A script paging past the end gets an empty page (a person, the last one).
        let (code, body) = http(
            web,
            "GET",
            &format!("/api/v1/namespaces/{MANY}/topics?offset=2500&limit=500"),
            &[&admin],
            "",
        );
        assert_eq!(code, 200);
        let page: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            (page["total"].as_u64(), page["offset"].as_u64()),
            (Some(2_500), Some(2_500))
        );
        assert_eq!(page["topics"].as_array().map(Vec::len), Some(0));
        let (code, body) = http(
            web,
            "GET",
            "/api/v1/namespaces/shop/topics?sort=bogus",
            &[&basic("admin", "admin-pw")],
            "",
        );
        assert_eq!(code, 400);
        assert!(
            body.starts_with(r#"{"error":{"code":"Bad Request","#),
            "{body}"
        );
        let form = "confirm=dead";
        let (code, body) = http(
            web,
            "POST",
            &format!("/ns/{NS}/t/dead/dlq/purge"),
            &[
                &basic("admin", "admin-pw"),
                "Content-Type: application/x-www-form-urlencoded",
            ],
            form,
        );
        assert_eq!(
            (code, body.trim()),
            (403, "refused: a form POST without an Origin header")
        );
        // An emptied number field is its default, not a refusal.
        let origin = format!("Origin: http://{web}");
        let (code, _) = http(
            web,
            "POST",
            &format!("/ns/{NS}/t/blank/enqueue"),
            &[
                &basic("admin", "admin-pw"),
                &origin,
                "Content-Type: application/x-www-form-urlencoded",
            ],
            "payload=x&priority=&delay_ms=",
        );
        assert_eq!(code, 303);
        assert_eq!(c.stats(NS, "blank").ready, Some(1));
        let (code, body) = http(
            web,
            "POST",
            &format!("/ns/{NS}/t/dead/dlq/purge"),
            &[
                &basic("admin", "admin-pw"),
                "Origin: http://evil.example",
                "Content-Type: application/x-www-form-urlencoded",
            ],
            form,
        );
        assert_eq!(
            (code, body.trim()),
            (403, "refused: the Origin is not this console")
        );

        c.enqueue(vec![item(NS, "dead", 0, b"last")]);
        let last = c.dequeue(NS, "dead", 1);
        c.nack(vec![to_dlq(last[0].id.as_deref().unwrap())]);
        let viewer = browser(&driver).await;
        let r = async {
            viewer
                .goto(&format!("http://viewer:viewer-pw@{web}/ns/{NS}/t/dead/dlq"))
                .await
                .unwrap();
            assert!(text(&viewer, "header .muted").await.ends_with("read-only"));
            viewer
                .find(Locator::Css("#purge input[name=confirm]"))
                .await
                .unwrap()
                .send_keys("dead")
                .await
                .unwrap();
            click(&viewer, "#purge button").await;
            // The click returns before the form's answer has loaded: wait for it (read at
            // once, the old page was seen once in a full run).
            let started = Instant::now();
            let mut page = viewer.source().await.unwrap();
            while !page.contains("refused: this user's role is read-only")
                && started.elapsed() < Duration::from_secs(10)
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
                page = viewer.source().await.unwrap();
            }
            assert!(
                page.contains("refused: this user's role is read-only"),
                "{page}"
            );
        }
        .await;
        let _ = viewer.close().await;
        let () = r;
        last[0].id.clone().unwrap()
    };
    let outcome = std::panic::AssertUnwindSafe(body).catch_unwind().await;
    let dead_id = match outcome {
        Ok(id) => id,
        Err(panic) => {
            if let Ok(png) = b.screenshot().await {
                let path = run_dir().join("console-failure.png");
                let _ = std::fs::write(&path, png);
                eprintln!("screenshot of the failure: {}", path.display());
            }
            let _ = b.close().await;
            std::panic::resume_unwind(panic);
        }
    };
    let _ = b.close().await;
    assert_eq!(
        c.stats(NS, "dead").dead,
        Some(1),
        "the read-only user purged nothing"
    );
    // Requeue by id through the API: each id alone.
    let (code, body) = http(
        web,
        "POST",
        "/api/v1/dlq/requeue",
        &[
            &basic("admin", "admin-pw"),
            "Content-Type: application/json",
        ],
        &format!(r#"{{"ids":["{dead_id}","9:999"]}}"#),
    );
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["requeued"], 1, "{body}");
    assert_eq!(v["failed"][0]["id"], "9:999", "{body}");
    assert_eq!(c.stats(NS, "dead").dead, Some(0));
    srv.stop().await;
}

/// Under `[[access]]` rules the console's calls are those of `console.identity`: what its
/// rules allow works, the rest is refused as it would be to a client (403, PERMISSION_DENIED).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_access_rules_the_console_acts_as_its_identity() {
    let extra = "[[access]]\nidentity = \"*\"\nnamespaces = [\"*\"]\nallow = [\"produce\"]\n\
                 [[access]]\nidentity = \"ops-console\"\nnamespaces = [\"seen\"]\nallow = [\"consume\", \"admin\"]\n\
                 [console]\nlisten = \"127.0.0.1:0\"\nidentity = \"ops-console\"\n";
    let srv = TestServer::start(2, extra).await;
    let web = srv.running.as_ref().unwrap().console_addr.unwrap();
    let mut c = srv.client();
    c.enqueue(vec![
        item("seen", "t", 0, b"a"),
        item("hidden", "t", 0, b"b"),
    ]);
    let (code, body) = http(web, "GET", "/api/v1/namespaces/seen/topics/t", &[], "");
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["items"]["ready"], 1, "{body}");
    let (code, body) = http(web, "GET", "/api/v1/namespaces/hidden/topics/t", &[], "");
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("PermissionDenied"), "{body}");
    let (code, body) = http(
        web,
        "POST",
        "/api/v1/namespaces/hidden/topics/t/dlq/purge",
        &["Content-Type: application/json"],
        r#"{"confirm":"t"}"#,
    );
    assert_eq!(code, 403);
    assert!(body.contains("PermissionDenied"), "{body}");
    let (code, body) = http(
        web,
        "POST",
        "/api/v1/namespaces/seen/topics/t/dlq/purge",
        &["Content-Type: application/json"],
        r#"{"confirm":"t"}"#,
    );
    assert_eq!((code, body.as_str()), (200, r#"{"count":0,"more":false}"#));
    // Lists show only what the identity may read.
    let (_, body) = http(web, "GET", "/api/v1/namespaces", &[], "");
    assert!(
        body.contains("\"seen\"") && !body.contains("hidden"),
        "{body}"
    );
    assert_eq!(
        http(web, "GET", "/api/v1/namespaces/hidden/topics", &[], "").0,
        403
    );
    // The HTML page says so too.
    let (code, page) = http(web, "GET", "/ns/hidden/t/t", &[], "");
    assert_eq!(code, 403);
    assert!(page.contains("id=\"error\""), "{page}");
    srv.stop().await;
}
