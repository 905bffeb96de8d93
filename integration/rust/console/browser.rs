//! What the console's tests drive a browser with: a chromedriver of their own, a
//! WebDriver session, and reading and clicking the page (each step waits for its element).

use super::*;

pub(super) fn run_dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".run");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A chromedriver of its own on a free port, killed when dropped, with the temporary
/// files of it and its browsers (Chromium leaves a singleton-socket folder behind in its
/// TMPDIR) in a folder of its own, removed when dropped.
pub(super) struct Driver {
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

pub(super) fn chromedriver() -> Driver {
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

pub(super) async fn browser(d: &Driver) -> Browser {
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
pub(super) fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[&str],
    body: &str,
) -> (u16, String) {
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

pub(super) fn basic(user: &str, pw: &str) -> String {
    use base64::Engine;
    format!(
        "Authorization: Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pw}"))
    )
}

/// The pages refresh their live part every `refresh_ms`, which replaces its elements: a
/// reading is taken in one script run (never stale), and a click is retried on an element
/// replaced between finding and clicking it.
pub(super) async fn texts(b: &Browser, css: &str) -> Vec<String> {
    let v = b
        .execute(
            "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.textContent);",
            vec![serde_json::json!(css)],
        )
        .await
        .unwrap();
    serde_json::from_value(v).unwrap()
}

pub(super) async fn attrs(b: &Browser, css: &str, attr: &str) -> Vec<String> {
    let v = b
        .execute(
            "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.getAttribute(arguments[1]));",
            vec![serde_json::json!(css), serde_json::json!(attr)],
        )
        .await
        .unwrap();
    serde_json::from_value(v).unwrap()
}

pub(super) async fn text(b: &Browser, css: &str) -> String {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(t) = texts(b, css).await.into_iter().next() {
            return t;
        }
        assert!(Instant::now() < until, "{css}: not on the page");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(super) async fn number(b: &Browser, css: &str) -> i64 {
    let t = text(b, css).await;
    t.trim()
        .parse()
        .unwrap_or_else(|_| panic!("{css} shows {t:?}, not a number"))
}

pub(super) async fn click(b: &Browser, css: &str) {
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

pub(super) async fn exists(b: &Browser, css: &str) -> bool {
    !texts(b, css).await.is_empty()
}

/// Waits until `f` holds (checked every 100 ms), for at most `secs`.
pub(super) async fn eventually<F, Fut>(secs: u64, what: &str, mut f: F)
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
pub(super) async fn settled(b: &Browser) {
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
pub(super) fn stats_sum(c: &mut Client, ns: &str, topics: &[String]) -> [i64; 4] {
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

pub(super) async fn cards(b: &Browser) -> [i64; 4] {
    let mut s = [0; 4];
    for (i, state) in ["ready", "deferred", "leased", "dead"].iter().enumerate() {
        s[i] = number(b, &format!("#items [data-state={state}] .value")).await;
    }
    s
}
