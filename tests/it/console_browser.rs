//! The console in a real headless Chromium (issue 17; tests/it/browser.rs): signing in through
//! the form as a person does — a wrong password shown and no session, the right one landing on
//! `/people` with a session cookie the page's scripts cannot read (`HttpOnly`) and that the
//! browser holds as `Secure; SameSite=Strict; Path=/`, and signing out ending it. Over plain
//! HTTP on loopback, where Chromium accepts `Secure` cookies.

use serde_json::json;

use crate::browser::{self, Browser};
use crate::console_auth::set_password;
use crate::review_support::{Server, StoreSel, user_with_token};
use crate::support::World;

const PASSWORD: &str = "correct horse battery staple";

#[test]
fn signing_in_and_out_through_the_form_in_a_real_browser() {
    if !browser::available() {
        return;
    }
    let world = World::new();
    let store = StoreSel::Embedded(world.tmp.path().join("store"));
    user_with_token(&world, &store, "ana@example.test", "admin");
    set_password(&world, &store, "ana@example.test", PASSWORD).expect_code(0);
    let server = Server::start(&world, &store, &[]);
    let b = Browser::start();

    let sign_in = |password: &str| {
        b.goto(&format!("{}/login", server.base));
        b.get("input[name=email]").type_text("ana@example.test");
        b.get("input[name=password]").type_text(password);
        b.click_and_wait("button[type=submit]");
    };
    // `AIRLOCK_SCREENSHOTS=docs/img` refreshes the pictures docs/console.md shows.
    let shot = |name: &str| {
        if let Some(dir) = std::env::var_os("AIRLOCK_SCREENSHOTS") {
            b.screenshot(&std::path::Path::new(&dir).join(name));
        }
    };
    b.goto(&format!("{}/login", server.base));
    shot("console-login.png");
    sign_in("not the password at all");
    assert!(b.url().ends_with("/login"), "{}", b.url());
    assert!(b.find("[role=alert]").is_some(), "no error shown:\n{}", b.source());
    assert!(
        !b.cookies().iter().any(|c| c["name"] == "__Host-airlock_session"),
        "a wrong password made a session: {:?}",
        b.cookies()
    );

    sign_in(PASSWORD);
    assert!(b.url().ends_with("/people"), "{}\n{}", b.url(), b.source());
    assert!(b.source().contains("signed in as ana@example.test (admin)"), "{}", b.source());
    let cookies = b.cookies();
    let session = cookies
        .iter()
        .find(|c| c["name"] == "__Host-airlock_session")
        .unwrap_or_else(|| panic!("no session cookie: {cookies:?}"));
    assert_eq!(session["httpOnly"], true, "{session}");
    assert_eq!(session["secure"], true, "{session}");
    assert_eq!(session["sameSite"], "Strict", "{session}");
    assert_eq!(session["path"], "/", "{session}");
    let visible = b.eval("return document.cookie", json!([]));
    assert!(!visible.as_str().unwrap_or("").contains("airlock_session"), "{visible}");

    b.click_and_wait("form[action='/logout'] button");
    b.goto(&format!("{}/people", server.base));
    assert!(b.url().ends_with("/login"), "still signed in after signing out: {}", b.url());
}

// ---------------------------------------------------------------------------------------
// The console's pages in the browser: hostile content stays text, the queue's keyboard, the
// triage forms, the member's 403, and the screenshots docs/console.md shows.

use crate::console_pages::{
    ANA, BO, Person, Plane, REV, REV2, eg, ingest, publish_session, raise, start_record,
};
use crate::review_flags::{act, listed};
use crate::review_support::{PgDb, all_events};
use airlock::review::{Micros, format_micros, now_micros};
use serde_json::Value;

const SEC: Micros = 1_000_000;
const HOUR: Micros = 3_600 * SEC;

/// The console's password of every [`Plane`] person.
const PLANE_PW: &str = "correct horse battery";

/// Signs `b` in as `p` through the form; lands on `/people`.
fn sign_in_as(b: &Browser, base: &str, p: &Person) {
    b.delete_cookies();
    b.goto(&format!("{base}/login"));
    b.get("input[name=email]").type_text(p.email);
    b.get("input[name=password]").type_text(PLANE_PW);
    b.click_and_wait("button[type=submit]");
    assert!(b.url().ends_with("/people"), "{} did not sign in: {}", p.email, b.source());
}

/// `AIRLOCK_SCREENSHOTS=docs/img` writes the pictures docs/console.md shows.
fn shot(b: &Browser, name: &str) {
    if let Some(dir) = std::env::var_os("AIRLOCK_SCREENSHOTS") {
        b.screenshot(&std::path::Path::new(&dir).join(name));
    }
}

const XSS: [&str; 4] = [
    r#"<img src=x onerror="window.__xss=1">"#,
    "<script>window.__xss=1</script>",
    r#""><svg onload=window.__xss=1>"#,
    "javascript:window.__xss=1",
];

/// Nothing injected ran or became markup: `window.__xss` is unset, and no element carries an
/// inline handler or an inline script (CSP would stop them running; this checks the escaping
/// itself).
fn assert_inert(b: &Browser, what: &str) {
    assert_eq!(b.eval("return typeof window.__xss", json!([])), "undefined", "{what}");
    let injected = b.eval(
        "return Array.prototype.filter.call(document.querySelectorAll('*'), function(e) { \
           return e.hasAttribute('onerror') || e.hasAttribute('onload') || \
             (e.tagName === 'SCRIPT' && !e.src) || \
             ((e.getAttribute('href') || '').toLowerCase().indexOf('javascript:') === 0); \
         }).map(function(e) { return e.outerHTML; })",
        json!([]),
    );
    assert_eq!(injected, json!([]), "{what}: injected markup");
    // The page's own script loaded and ran (the CSP allows it): the queue page marks rows.
    assert_eq!(
        b.eval(
            "return document.querySelectorAll('script[src=\"/assets/console.js\"]').length",
            json!([])
        ),
        1,
        "{what}"
    );
}

/// Whether the page's text (`textContent`: collapsed details included) holds `s`.
fn page_text_has(b: &Browser, s: &str) -> bool {
    b.eval("return document.body.textContent.indexOf(arguments[0]) >= 0", json!([s])) == true
}

/// Whether the rendered, visible text (`innerText`) holds `s`.
fn visible_text_has(b: &Browser, s: &str) -> bool {
    b.eval("return document.body.innerText.indexOf(arguments[0]) >= 0", json!([s])) == true
}

#[test]
fn console_pages_render_hostile_content_as_text_in_a_real_browser() {
    if !browser::available() {
        return;
    }
    let world = World::new();
    let store = StoreSel::Embedded(world.tmp.path().join("store"));
    let p = Plane::start(&world, &store);
    let base = p.base();
    let t0 = now_micros() - HOUR;
    let at = |s: i64| format_micros(t0 + s * SEC);
    let session = XSS[3];
    let mut items = vec![start_record(session, t0, ANA, &p.ana.id)];
    for (i, x) in XSS.iter().enumerate() {
        let mut e =
            eg(&format!("x-eg-{i}"), t0 + (i as i64 + 1) * SEC, session, i as u64 + 1, x, true);
        e["payload"]["reason"] = json!(x);
        items.push(e);
    }
    items.push(json!({"id": "x-c1", "source": "claude", "type": "user", "ts": at(10),
        "session": "agent-x", "airlock_session": session, "file": ".claude/projects/-x/x.jsonl",
        "offset": 0,
        "payload": {"type": "user", "uuid": "x-c1", "sessionId": "agent-x", "timestamp": at(10),
                    "message": {"role": "user", "content": XSS[1]}}}));
    items.push(json!({"id": "x-c2", "source": "claude", "type": "assistant", "ts": at(11),
        "session": "agent-x", "airlock_session": session, "file": ".claude/projects/-x/x.jsonl",
        "offset": 100,
        "payload": {"type": "assistant", "uuid": "x-c2", "sessionId": "agent-x", "timestamp": at(11),
                    "message": {"role": "assistant", "content": [
                        {"type": "text", "text": XSS[0]},
                        {"type": "tool_use", "id": "t1", "name": XSS[2], "input": {"command": XSS[2], "file_path": XSS[0]}}]}}}));
    items.push(json!({"id": XSS[1], "source": "external", "type": XSS[0], "ts": at(12),
        "payload": {"note": XSS[2]}}));
    ingest(&world, base, &p.ana.token, &items);
    // A flag on that session with a hostile note.
    let mut paste = eg("x-paste", t0 + 13 * SEC, session, 9, "pastebin.com", false);
    paste["payload"]["path"] = json!(XSS[1]);
    ingest(&world, base, &p.ana.token, &[paste]);
    let flags = listed_flags(base, &p.admin.token);
    let flag = flags
        .iter()
        .find(|f| f["rule_id"] == "egress.paste-or-tunnel-host")
        .unwrap_or_else(|| panic!("no paste flag: {flags:?}"))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let r = act(base, &p.rev.token, &flag, &json!({"action": "acknowledge", "note": XSS[0]}));
    assert_eq!(r.status, 200, "{}", r.body);

    let b = Browser::start();
    sign_in_as(&b, base, &p.rev);
    assert_inert(&b, "/people");
    b.goto(&format!("{base}/people/{}", p.ana.id));
    assert_inert(&b, "timeline");
    for x in [XSS[0], XSS[2]] {
        assert!(
            visible_text_has(&b, &format!("CONNECT {x}:443")),
            "{x} not shown:\n{}",
            b.source()
        );
    }
    assert!(visible_text_has(&b, XSS[1]), "the prompt is shown");
    // The session link keeps the hostile id inside the path.
    let href = b.get("table.tl a[href^='/sessions/']").attr("href").unwrap();
    assert!(href.starts_with("/sessions/javascript%3Awindow.__xss%3D1?user="), "{href}");
    b.goto(&format!(
        "{base}/people/{}?q={}",
        p.ana.id, "%3Cscript%3Ewindow.__xss%3D1%3C%2Fscript%3E"
    ));
    assert_inert(&b, "timeline with a hostile filter");
    assert_eq!(b.get("input[name=q]").attr("value").as_deref(), Some(XSS[1]));
    b.click_and_wait("table.tl a[href^='/sessions/']");
    assert!(b.url().contains("/sessions/javascript%3Awindow.__xss%3D1"), "{}", b.url());
    assert_inert(&b, "session");
    assert!(visible_text_has(&b, &format!("Session {}", XSS[3])), "{}", b.source());
    for x in XSS {
        assert!(page_text_has(&b, x), "{x} not on the session page:\n{}", b.source());
    }
    assert!(visible_text_has(&b, XSS[1]), "the prompt");
    assert!(visible_text_has(&b, &format!("Tool call: {}", XSS[2])), "the tool call");
    b.goto(&format!("{base}/flags?state="));
    assert_inert(&b, "/flags");
    assert!(page_text_has(&b, XSS[0]), "the note, in the history");
    // The session column shows the id cut to 24 characters.
    assert!(visible_text_has(&b, &XSS[3][..24]), "the session id");
    let title = b.get("table.queue a[href^='/sessions/']").attr("href").unwrap();
    assert!(title.starts_with("/sessions/javascript%3Awindow.__xss%3D1?user="), "{title}");
    b.get(&format!("details:has(form[action='/flags/{flag}']) > summary")).click();
    assert!(visible_text_has(&b, XSS[0]), "the note, shown once opened:\n{}", b.source());
    assert_inert(&b, "/flags opened");
    let adm = Browser::start();
    sign_in_as(&adm, base, &p.admin);
    adm.goto(&format!("{base}/access-log"));
    assert_inert(&adm, "/access-log");
    assert!(page_text_has(&adm, XSS[1]), "the filter read is listed:\n{}", adm.source());
    assert!(page_text_has(&adm, XSS[3]), "the session read is listed");
}

/// Every flag as the API lists it (newest first).
fn listed_flags(base: &str, token: &str) -> Vec<Value> {
    let r = crate::review_support::get(base, token, "/api/v1/flags?limit=1000", &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["flags"].as_array().unwrap().clone()
}

#[test]
fn console_flags_queue_keyboard_in_a_real_browser() {
    if !browser::available() {
        return;
    }
    let world = World::new();
    let store = StoreSel::Embedded(world.tmp.path().join("store"));
    let p = Plane::start(&world, &store);
    let t0 = now_micros() - HOUR;
    for (i, who) in [&p.ana, &p.bo, &p.ana].into_iter().enumerate() {
        raise(&world, &p, who, &format!("kb-{i}"), t0 + i as i64 * SEC);
    }
    let b = Browser::start();
    sign_in_as(&b, p.base(), &p.rev);
    b.goto(&format!("{}/flags", p.base()));
    let focused = || b.active().attr("href").unwrap_or_default();
    let current = || {
        b.eval("var r = document.querySelector('tr.cur a.open'); return r ? r.getAttribute('href') : null", json!([]))
    };
    b.keys("j");
    assert_eq!(focused(), "#f0", "j focuses the first flag");
    assert_eq!(current(), "#f0", "its row is marked");
    b.keys("j");
    assert_eq!(focused(), "#f1");
    b.keys("j");
    b.keys("j");
    assert_eq!(focused(), "#f2", "j stops at the last flag");
    b.keys("k");
    assert_eq!(focused(), "#f1", "k goes back");
    assert_eq!(current(), "#f1");
    let open =
        |id: &str| b.eval(&format!("return document.getElementById('{id}').open"), json!([]));
    assert_eq!(open("f1"), false);
    b.keys("\u{E007}");
    assert_eq!(open("f1"), true, "Enter opens the focused flag's details");
    assert_eq!(open("f0"), false);
    assert_eq!(b.active().tag(), "summary", "the focus moves into the details");
    assert!(b.url().ends_with("/flags"), "Enter did not follow the link: {}", b.url());
    // From inside the opened flag, j and k go on from that flag.
    b.keys("j");
    assert_eq!(focused(), "#f2", "j after Enter moves to the next flag");
    b.keys("k");
    b.keys("k");
    assert_eq!(focused(), "#f0");
    // Typing in a form is typing, not moving.
    b.keys("\u{E007}");
    let note = b.get("details#f0 textarea[name=note]");
    note.click();
    b.keys("jk");
    assert_eq!(b.active().tag(), "textarea");
    assert_eq!(b.eval("return document.activeElement.value", json!([])), "jk");
}

/// A reviewer acknowledges (with a note) and assigns a flag through the queue's forms; the
/// history then shows both, with the actor; the API agrees.
fn triage_in_browser(world: &World, store: &StoreSel) {
    let p = Plane::start(world, store);
    let base = p.base();
    let flag = raise(world, &p, &p.ana, "tri-1", now_micros() - HOUR);
    let b = Browser::start();
    sign_in_as(&b, base, &p.rev);
    b.goto(&format!("{base}/flags"));
    b.get("details#f0 > summary").click();
    let form = "details#f0 .actions form:nth-of-type(1)";
    // The same form without its csrf field (as a forged cross-site form would be) is refused
    // and changes nothing.
    b.eval(&format!("document.querySelector('{form} input[name=csrf]').remove()"), json!([]));
    b.get(&format!("{form} option[value=resolve]")).click();
    b.get(&format!("{form} textarea[name=note]")).type_text("forged");
    b.click_and_wait(&format!("{form} button[type=submit]"));
    assert!(b.source().contains("Form refused"), "{}", b.source());
    assert_eq!(listed(base, &p.admin.token, &flag)["state"], json!("open"));
    b.goto(&format!("{base}/flags"));
    b.get("details#f0 > summary").click();
    b.get(&format!("{form} option[value=acknowledge]")).click();
    b.get(&format!("{form} textarea[name=note]"))
        .type_text("talked to ana: a paste of test output");
    b.click_and_wait(&format!("{form} button[type=submit]"));
    assert!(b.url().ends_with("/flags"), "{}\n{}", b.url(), b.source());
    b.get("details#f0 > summary").click();
    let assign = "details#f0 .actions form:nth-of-type(2)";
    b.get(&format!("{assign} input[name=assignee]")).type_text(REV2);
    b.click_and_wait(&format!("{assign} button[type=submit]"));
    assert!(b.url().ends_with("/flags"), "{}\n{}", b.url(), b.source());
    b.get("details#f0 > summary").click();
    let rows = b.eval(
        "return Array.prototype.map.call(document.querySelectorAll('details#f0 table tbody tr'), \
           function(r) { return Array.prototype.map.call(r.cells, function(c) { return c.innerText.trim(); }); })",
        json!([]),
    );
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0][1], "acknowledged", "{rows:?}");
    assert_eq!(rows[0][2], REV, "{rows:?}");
    assert_eq!(rows[0][3], "talked to ana: a paste of test output", "{rows:?}");
    assert_eq!(rows[1][1], format!("assigned to {REV2}"), "{rows:?}");
    assert_eq!(rows[1][2], REV, "{rows:?}");
    let row = b.get("table.queue tr.fr").text();
    assert!(row.contains("acknowledged") && row.contains(&format!("assigned to {REV2}")), "{row}");
    let v = listed(base, &p.admin.token, &flag);
    assert_eq!((&v["state"], &v["assignee_email"]), (&json!("acknowledged"), &json!(REV2)), "{v}");
    assert_eq!(v["history"][0]["actor"], json!(p.rev.id), "{v}");
}

#[test]
fn console_triage_through_the_forms_in_a_real_browser_embedded() {
    if !browser::available() {
        return;
    }
    let world = World::new();
    triage_in_browser(&world, &StoreSel::Embedded(world.tmp.path().join("store")));
}

#[test]
fn console_triage_through_the_forms_in_a_real_browser_postgres() {
    if !browser::available() {
        return;
    }
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    triage_in_browser(&world, &StoreSel::Pg(db.runtime_url.clone()));
}

#[test]
fn console_member_sees_a_403_for_another_person_in_a_real_browser() {
    if !browser::available() {
        return;
    }
    let world = World::new();
    let store = StoreSel::Embedded(world.tmp.path().join("store"));
    let p = Plane::start(&world, &store);
    ingest(
        &world,
        p.base(),
        &p.bo.token,
        &[eg("bo-1", now_micros() - HOUR, "s-bo", 1, "bo-secret.example.test", true)],
    );
    let b = Browser::start();
    sign_in_as(&b, p.base(), &p.ana);
    for path in [format!("/people/{}", p.bo.id), format!("/people/{BO}"), "/people/u-nobody".into()]
    {
        b.goto(&format!("{}{path}", p.base()));
        assert_eq!(b.title(), "Not yours to see · Airlock review", "{path}");
        assert!(visible_text_has(&b, "Members see only their own history"), "{path}");
        let src = b.source();
        for leak in [BO, p.bo.id.as_str(), "bo-secret.example.test", "u-nobody"] {
            assert!(!src.contains(leak), "{path}: the page shows {leak}:\n{src}");
        }
    }
    b.goto(&format!("{}/sessions/s-bo?user={}", p.base(), p.bo.id));
    assert_eq!(b.title(), "Not yours to see · Airlock review");
    assert!(!b.source().contains("bo-secret.example.test"));
    // Their own page works.
    b.goto(&format!("{}/people/{}", p.base(), p.ana.id));
    assert_eq!(b.title(), format!("Timeline of {ANA} · Airlock review"));
}

/// A realistic plane (a few people, allowed and denied egress, a Claude session with tool
/// calls, flags in several states, reads recorded) shown page by page; with
/// `AIRLOCK_SCREENSHOTS` set, each page's picture is written there.
#[test]
fn console_pages_with_realistic_data_in_a_real_browser() {
    if !browser::available() {
        return;
    }
    let world = World::new();
    let store = StoreSel::Embedded(world.tmp.path().join("store"));
    let p = Plane::start(&world, &store);
    let base = p.base();
    let now = now_micros();
    let t0 = now - 3 * HOUR;
    publish_session(&world, base, &p.ana, "s-7f3a", t0);
    let hosts = [
        ("api.anthropic.com", true),
        ("github.com", true),
        ("index.crates.io", true),
        ("static.crates.io", true),
        ("registry.npmjs.org", false),
        ("api.anthropic.com", true),
        ("objects.githubusercontent.com", true),
        ("telemetry.example.net", false),
    ];
    // A second, still running session after the first.
    let mut ana = vec![start_record("s-b41e", t0 + 35 * SEC, ANA, &p.ana.id)];
    for (i, (h, ok)) in hosts.iter().enumerate() {
        let ts = t0 + 40 * SEC + i as i64 * 7 * 60 * SEC;
        ana.push(eg(&format!("ana-{i}"), ts, "s-b41e", 1 + i as u64, h, *ok));
    }
    ingest(&world, base, &p.ana.token, &ana);
    let mut bo = vec![start_record("s-91c0", now - 5 * HOUR, BO, &p.bo.id)];
    for (i, (h, ok)) in hosts.iter().rev().enumerate() {
        let ts = now - 5 * HOUR + (i as i64 + 1) * 11 * 60 * SEC;
        bo.push(eg(&format!("bo-{i}"), ts, "s-91c0", i as u64 + 1, h, *ok));
    }
    ingest(&world, base, &p.bo.token, &bo);
    ingest(
        &world,
        base,
        &p.rev2.token,
        &[eg("r2-1", now - 20 * 60 * SEC, "s-r2", 1, "github.com", true)],
    );
    let f_bo = raise(&world, &p, &p.bo, "bo-webhook", now - 2 * HOUR);
    let f_ana = listed_flags(base, &p.admin.token)
        .into_iter()
        .find(|f| f["user_id"] == json!(p.ana.id))
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let r = act(
        base,
        &p.rev2.token,
        &f_bo,
        &json!({"action": "acknowledge", "note": "asked bo; looking at the session"}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let r = act(base, &p.rev2.token, &f_bo, &json!({"action": "assign", "assignee": REV}));
    assert_eq!(r.status, 200, "{}", r.body);

    let b = Browser::start();
    sign_in_as(&b, base, &p.rev);
    let rows =
        b.eval("return document.querySelectorAll('table.people tbody tr').length", json!([]));
    assert_eq!(rows, 5, "{}", b.source());
    assert!(visible_text_has(&b, ANA) && visible_text_has(&b, BO));
    shot(&b, "console-people.png");

    b.goto(&format!("{base}/people/{}", p.ana.id));
    assert!(visible_text_has(&b, "CONNECT registry.npmjs.org:443"), "{}", b.source());
    assert!(b.find("svg.chart").is_some(), "the hour chart is drawn:\n{}", b.source());
    shot(&b, "console-timeline.png");

    b.click_and_wait("table.tl a[href^='/sessions/s-7f3a']");
    assert!(b.url().contains("/sessions/s-7f3a"), "{}", b.url());
    assert!(visible_text_has(&b, "Why does the retry test flake?"));
    assert!(visible_text_has(&b, "Tool call: Read"));
    assert!(visible_text_has(&b, "CONNECT pastebin.com"));
    shot(&b, "console-session.png");

    b.goto(&format!("{base}/flags?state="));
    let n = b.eval("return document.querySelectorAll('table.queue tr.fr').length", json!([]));
    // The paste-site egress of both, and the Stripe test key in ana's transcript.
    assert_eq!(n, 3, "{:#?}", listed_flags(base, &p.admin.token));
    assert!(visible_text_has(&b, &format!("assigned to {REV}")));
    // bo's flag, with its history, opened from the keyboard.
    b.keys("jjj");
    b.keys("\u{E007}");
    assert!(visible_text_has(&b, "asked bo; looking at the session"), "{}", b.source());
    shot(&b, "console-flags.png");
    assert!(!f_ana.is_empty());

    let adm = Browser::start();
    sign_in_as(&adm, base, &p.admin);
    adm.goto(&format!("{base}/access-log"));
    let readers = adm.eval(
        "return Array.prototype.map.call(document.querySelectorAll('table.access tbody tr'), function(r) { return r.cells[1].innerText + ' ' + r.cells[2].innerText; })",
        json!([]),
    );
    let readers: Vec<&str> = readers.as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(readers.contains(&format!("{REV} timeline").as_str()), "{readers:?}");
    assert!(readers.contains(&format!("{REV} session").as_str()), "{readers:?}");
    shot(&adm, "console-access-log.png");
    // The reads shown are the ones stored.
    let stored = all_events(base, &p.admin.token, &format!("&user={REV}&source=external"))
        .into_iter()
        .filter(|e| e["type"] == "airlock.review.read" && e["payload"]["via"] == "console")
        .count();
    assert!(stored >= 4, "{stored}");
}
