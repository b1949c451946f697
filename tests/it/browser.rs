//! A real headless Chromium for the console's tests (issue 17), driven over the W3C WebDriver
//! protocol (<https://www.w3.org/TR/webdriver2/>) by Debian's ChromeDriver, both from
//! `.ci/prereqs`; never a browser download. The client is a few blocking HTTP/1.1 calls to
//! ChromeDriver on loopback.
//!
//! Network safety: the browser runs with a fresh `--user-data-dir`, background networking,
//! component updates and sync off, every host name resolved to nothing except loopback
//! (`--host-resolver-rules`), and every non-loopback connection sent to a dead proxy on
//! 127.0.0.1:9, so a page can reach nothing but the loopback server under test.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::in_ci;

pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// Whether Chromium and ChromeDriver are installed; in CI their absence fails the test.
pub fn available() -> bool {
    let ok = Path::new(CHROMIUM).exists() && Path::new(CHROMEDRIVER).exists();
    assert!(ok || !in_ci(), "CI needs {CHROMIUM} and {CHROMEDRIVER} (.ci/prereqs installs them)");
    if !ok {
        eprintln!("skipped: no {CHROMIUM} / {CHROMEDRIVER} (run .ci/prereqs)");
    }
    ok
}

/// One ChromeDriver process with one browser session; both end on drop.
pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
    _profile: tempfile::TempDir,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// One request to ChromeDriver; the parsed JSON answer (`value` of a W3C reply).
fn call(port: u16, method: &str, path: &str, body: Option<&Value>) -> Result<Value, String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .map_err(|e| e.to_string())?;
    let mut r = BufReader::new(s);
    let mut status = String::new();
    r.read_line(&mut status).map_err(|e| e.to_string())?;
    let code: u16 = status.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let mut len = None;
    loop {
        let mut h = String::new();
        r.read_line(&mut h).map_err(|e| e.to_string())?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            len = v.trim().parse::<usize>().ok();
        }
    }
    let mut buf = Vec::new();
    match len {
        Some(n) => {
            buf.resize(n, 0);
            r.read_exact(&mut buf).map_err(|e| e.to_string())?;
        }
        None => {
            r.read_to_end(&mut buf).map_err(|e| e.to_string())?;
        }
    }
    let v: Value = serde_json::from_slice(&buf)
        .map_err(|e| format!("{e}: {}", String::from_utf8_lossy(&buf)))?;
    if code != 200 {
        return Err(format!("{method} {path}: {code} {}", v["value"]));
    }
    Ok(v["value"].clone())
}

impl Browser {
    /// Starts ChromeDriver and a headless Chromium with the flags the test rules require.
    pub fn start() -> Browser {
        let port = free_port();
        let profile = tempfile::tempdir().unwrap();
        let log = profile.path().join("chromedriver.log");
        let driver = Command::new(CHROMEDRIVER)
            .args([format!("--port={port}"), format!("--log-path={}", log.display())])
            .arg("--allowed-ips=127.0.0.1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let end = Instant::now() + Duration::from_secs(30);
        while call(port, "GET", "/status", None).is_err() {
            assert!(Instant::now() < end, "chromedriver did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        let data = profile.path().join("data");
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            &format!("--user-data-dir={}", data.display()),
            // Names resolve to nothing; loopback addresses go direct (Chromium's implicit
            // proxy bypass), anything else to a port nobody listens on.
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.*, EXCLUDE [::1]",
            "--proxy-server=http://127.0.0.1:9",
            "--window-size=1280,900",
        ];
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": CHROMIUM, "args": args},
        }}});
        let v = call(port, "POST", "/session", Some(&caps))
            .unwrap_or_else(|e| panic!("no browser session: {e}"));
        let session = v["sessionId"].as_str().unwrap().to_owned();
        Browser { driver, port, session, _profile: profile }
    }

    fn at(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let p = format!("/session/{}{path}", self.session);
        call(self.port, method, &p, body.as_ref()).unwrap_or_else(|e| panic!("{e}"))
    }

    pub fn goto(&self, url: &str) {
        self.at("POST", "/url", Some(json!({ "url": url })));
    }

    pub fn url(&self) -> String {
        self.at("GET", "/url", None).as_str().unwrap_or_default().to_owned()
    }

    pub fn source(&self) -> String {
        self.at("GET", "/source", None).as_str().unwrap_or_default().to_owned()
    }

    pub fn title(&self) -> String {
        self.at("GET", "/title", None).as_str().unwrap_or_default().to_owned()
    }

    /// Runs `script` in the page (a function body; `arguments` holds `args`) and returns its
    /// result.
    pub fn eval(&self, script: &str, args: Value) -> Value {
        self.at("POST", "/execute/sync", Some(json!({ "script": script, "args": args })))
    }

    /// Clicks the element matching `css` — a submit button or a link — and waits until the
    /// page it leads to has loaded. A WebDriver click returns once the click is dispatched,
    /// not when the navigation it starts is done: reading the URL or the page right after a
    /// bare `click` raced with the form's POST on a loaded CI machine.
    pub fn click_and_wait(&self, css: &str) {
        self.eval("window.__airlockOldPage = true", json!([]));
        self.get(css).click();
        self.wait_for_new_page(css);
    }

    fn wait_for_new_page(&self, what: &str) {
        let path = format!("/session/{}/execute/sync", self.session);
        let script = "return window.__airlockOldPage === undefined && \
                      document.readyState === 'complete'";
        // While the old page unloads a script call may fail: that is "not yet".
        let loaded = || {
            call(self.port, "POST", &path, Some(&json!({"script": script, "args": []}))).ok()
                == Some(json!(true))
        };
        assert!(
            crate::support::wait_until(Duration::from_secs(30), loaded),
            "no new page loaded after {what:?}; still at {}",
            self.url()
        );
    }

    /// The first element matching a CSS selector, or `None`.
    pub fn find(&self, css: &str) -> Option<Element<'_>> {
        let p = format!("/session/{}/element", self.session);
        let v = call(self.port, "POST", &p, Some(&json!({"using": "css selector", "value": css})))
            .ok()?;
        let id = v.as_object()?.values().next()?.as_str()?.to_owned();
        Some(Element { b: self, id })
    }

    /// [`Self::find`], panicking with the page source when absent.
    pub fn get(&self, css: &str) -> Element<'_> {
        self.find(css)
            .unwrap_or_else(|| panic!("no element {css} on {}:\n{}", self.url(), self.source()))
    }

    /// The element that has the focus.
    pub fn active(&self) -> Element<'_> {
        let v = self.at("GET", "/element/active", None);
        let id = v.as_object().unwrap().values().next().unwrap().as_str().unwrap().to_owned();
        Element { b: self, id }
    }

    /// Key presses sent to the page (W3C key actions: `\u{E007}` is Enter, `\u{E004}` Tab).
    pub fn keys(&self, text: &str) {
        let mut actions = Vec::new();
        for c in text.chars() {
            actions.push(json!({"type": "keyDown", "value": c.to_string()}));
            actions.push(json!({"type": "keyUp", "value": c.to_string()}));
        }
        self.at(
            "POST",
            "/actions",
            Some(json!({"actions": [{"type": "key", "id": "kbd", "actions": actions}]})),
        );
    }

    pub fn cookies(&self) -> Vec<Value> {
        self.at("GET", "/cookie", None).as_array().cloned().unwrap_or_default()
    }

    pub fn delete_cookies(&self) {
        self.at("DELETE", "/cookie", None);
    }

    /// A PNG of the viewport, written to `path`.
    pub fn screenshot(&self, path: &Path) {
        let v = self.at("GET", "/screenshot", None);
        let png = base64_decode(v.as_str().unwrap());
        if let Some(d) = path.parent() {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(path, png).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = call(self.port, "DELETE", &format!("/session/{}", self.session), None);
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// Standard base64 (RFC 4648 §4), as WebDriver returns screenshots.
fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let clean: Vec<u8> = s.bytes().filter(|c| !c.is_ascii_whitespace() && *c != b'=').collect();
    let mut out = Vec::with_capacity(clean.len() * 3 / 4);
    for chunk in clean.chunks(4) {
        let mut n = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            n |= u32::from(val(*c)) << (18 - 6 * i);
        }
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    out
}

/// One element of the page.
pub struct Element<'a> {
    b: &'a Browser,
    id: String,
}

impl Element<'_> {
    fn at(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        self.b.at(method, &format!("/element/{}{path}", self.id), body)
    }
    pub fn click(&self) {
        self.at("POST", "/click", Some(json!({})));
    }
    pub fn type_text(&self, text: &str) {
        self.at("POST", "/value", Some(json!({ "text": text })));
    }
    pub fn clear(&self) {
        self.at("POST", "/clear", Some(json!({})));
    }
    pub fn text(&self) -> String {
        self.at("GET", "/text", None).as_str().unwrap_or_default().to_owned()
    }
    pub fn attr(&self, name: &str) -> Option<String> {
        self.at("GET", &format!("/attribute/{name}"), None).as_str().map(str::to_owned)
    }
    pub fn tag(&self) -> String {
        self.at("GET", "/name", None).as_str().unwrap_or_default().to_owned()
    }
}

/// The harness itself: a page served from loopback loads, runs its script, takes typed input
/// and a click, and a host outside loopback is unreachable from it.
#[test]
fn the_browser_harness_drives_a_loopback_page_and_reaches_nothing_else() {
    if !available() {
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let page = "<!doctype html><title>t</title><input id=q><button id=b \
                onclick=\"document.title='clicked:'+document.getElementById('q').value\">go</button>\
                <script>document.body.dataset.js='ran'</script>";
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { continue };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nSet-Cookie: probe=1; Path=/\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
                page.len()
            );
        }
    });
    let b = Browser::start();
    b.goto(&format!("http://127.0.0.1:{port}/"));
    assert_eq!(b.eval("return document.body.dataset.js", json!([])), "ran");
    let q = b.get("#q");
    q.type_text("typed");
    q.clear();
    q.type_text("hello");
    assert_eq!(b.active().attr("id").as_deref(), Some("q"));
    // Tab moves the focus to the button, Enter presses it.
    b.keys("\u{E004}");
    assert_eq!(b.active().tag(), "button");
    assert_eq!(b.active().text(), "go");
    b.keys("\u{E007}");
    assert_eq!(b.title(), "clicked:hello");
    b.get("#b").click();
    assert_eq!(b.title(), "clicked:hello");
    assert!(b.cookies().iter().any(|c| c["name"] == "probe"), "{:?}", b.cookies());
    b.delete_cookies();
    assert!(b.cookies().is_empty());
    // A name outside loopback resolves to nothing (`no-cors`: a reached server would resolve
    // the promise with an opaque answer instead of rejecting it).
    let r = b.eval(
        "return fetch('http://example.test/', {mode: 'no-cors'}).then(() => 'reached', e => 'failed: ' + e)",
        json!([]),
    );
    assert!(r.as_str().unwrap().starts_with("failed"), "{r}");
    let png = tempfile::tempdir().unwrap();
    b.screenshot(&png.path().join("page.png"));
    let bytes = std::fs::read(png.path().join("page.png")).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
}
