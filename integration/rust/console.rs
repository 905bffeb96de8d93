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

fn run_dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".run");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A chromedriver of its own on a free port, killed when dropped, with the temporary
/// files of it and its browsers (Chromium leaves a singleton-socket folder behind in its
/// TMPDIR) in a folder of its own, removed when dropped.
struct Driver {
    child: Child,
    url: String,
    tmp: PathBuf,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}

fn chromedriver() -> Driver {
    let bin = ["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .expect(
            "chromedriver not found: the README's test command (scripts/test.sh) installs \
             Debian's chromium and chromium-driver",
        );
    let port = free_port();
    // Short, under /tmp: Chromium's singleton socket lives below it, and a Unix socket's
    // path is at most 107 bytes.
    let tmp = std::env::temp_dir().join(format!("foqs-chromium-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let child = Command::new(bin)
        .arg(format!("--port={port}"))
        .env("TMPDIR", &tmp)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver starts");
    let until = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < until, "chromedriver did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    Driver {
        child,
        url: format!("http://127.0.0.1:{port}"),
        tmp,
    }
}

async fn browser(d: &Driver) -> Browser {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": "/usr/bin/chromium",
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,1000", "--no-first-run"]
        }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&d.url)
        .await
        .expect("a Chromium session")
}

/// A plain HTTP request (no browser): the status code and the body (`Host` is the
/// console's address unless `headers` name one).
fn http(addr: SocketAddr, method: &str, path: &str, headers: &[&str], body: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers
        .iter()
        .any(|h| h.to_ascii_lowercase().starts_with("host:"))
    {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    for h in headers {
        req.push_str(h);
        req.push_str("\r\n");
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let code = out[9..12].parse().unwrap();
    let body = out
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (code, body)
}

fn basic(user: &str, pw: &str) -> String {
    use base64::Engine;
    format!(
        "Authorization: Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pw}"))
    )
}

/// The pages refresh their live part every `refresh_ms`, which replaces its elements: a
/// reading is taken in one script run (never stale), and a click is retried on an element
/// replaced between finding and clicking it.
async fn texts(b: &Browser, css: &str) -> Vec<String> {
    let v = b
        .execute(
            "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.textContent);",
            vec![serde_json::json!(css)],
        )
        .await
        .unwrap();
    serde_json::from_value(v).unwrap()
}

async fn attrs(b: &Browser, css: &str, attr: &str) -> Vec<String> {
    let v = b
        .execute(
            "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.getAttribute(arguments[1]));",
            vec![serde_json::json!(css), serde_json::json!(attr)],
        )
        .await
        .unwrap();
    serde_json::from_value(v).unwrap()
}

async fn text(b: &Browser, css: &str) -> String {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(t) = texts(b, css).await.into_iter().next() {
            return t;
        }
        assert!(Instant::now() < until, "{css}: not on the page");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn number(b: &Browser, css: &str) -> i64 {
    let t = text(b, css).await;
    t.trim()
        .parse()
        .unwrap_or_else(|_| panic!("{css} shows {t:?}, not a number"))
}

async fn click(b: &Browser, css: &str) {
    // Retried for a while, not a few times: on a loaded machine a refresh of a 500-row
    // page can take about as long as the refresh interval, and five clicks in a row met a
    // replaced element.
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        let e = b
            .wait()
            .at_most(Duration::from_secs(10))
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"));
        match e.click().await {
            Ok(()) => return,
            Err(fantoccini::error::CmdError::Standard(w))
                if w.error == fantoccini::error::ErrorStatus::StaleElementReference => {}
            Err(e) => panic!("click {css}: {e}"),
        }
    }
    panic!("{css}: replaced under every click for 10 s");
}

async fn exists(b: &Browser, css: &str) -> bool {
    !texts(b, css).await.is_empty()
}

/// Waits until `f` holds (checked every 100 ms), for at most `secs`.
async fn eventually<F, Fut>(secs: u64, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let until = Instant::now() + Duration::from_secs(secs);
    while !f().await {
        assert!(Instant::now() < until, "{what}: not within {secs} s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until none of the page's htmx requests is in flight (htmx marks the element
/// that sent one with `htmx-request` until its answer is swapped in): a refresh sent just
/// before the page was paused or hidden may otherwise land after the next enqueue (seen
/// once under load: the hidden tab showed the item enqueued after it was hidden).
async fn settled(b: &Browser) {
    eventually(10, "the page's requests in flight end", || async {
        b.execute(
            "return document.querySelectorAll('.htmx-request').length;",
            vec![],
        )
        .await
        .ok()
        .and_then(|v| v.as_i64())
            == Some(0)
    })
    .await;
}

/// Sums topicStats over topics: (ready, deferred, leased, dead).
fn stats_sum(c: &mut Client, ns: &str, topics: &[String]) -> [i64; 4] {
    let mut s = [0; 4];
    for t in topics {
        let st = c.stats(ns, t);
        s[0] += st.ready.unwrap();
        s[1] += st.deferred.unwrap();
        s[2] += st.leased.unwrap();
        s[3] += st.dead.unwrap();
    }
    s
}

async fn cards(b: &Browser) -> [i64; 4] {
    let mut s = [0; 4];
    for (i, state) in ["ready", "deferred", "leased", "dead"].iter().enumerate() {
        s[i] = number(b, &format!("#items [data-state={state}] .value")).await;
    }
    s
}

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
