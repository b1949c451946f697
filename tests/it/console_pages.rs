//! The console's pages (issue 17, docs/console.md) through the real `airlockd review` on
//! loopback and curl with a cookie jar, each on both stores: `/people` (counts, scoping, the
//! read record), one person's timeline (interleaving by `ts`, every filter, the older-cursor
//! paging with no gap and no overlap, the member's 403 that names nobody), the session
//! drill-down, the flags queue's forms (CSRF, notes, assignment, bulk, the self-action rule),
//! the admins' access log and the console export (JSONL and CSV, recorded). Every page carries
//! the security headers and stays under 200 KB.

use crate::console_auth::{Browser, assert_console_headers, csrf_of, header, set_password};
use crate::review_flags::listed;
use crate::review_support::*;
use crate::support::{World, have};
use airlock::review::{Micros, format_micros, now_micros};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

pub(crate) const PW: &str = "correct horse battery";
const SEC: Micros = 1_000_000;
const HOUR: Micros = 3_600 * SEC;
const DAY: Micros = 24 * HOUR;
/// Pages stay under this (docs/console.md).
const PAGE_MAX: usize = 200 * 1024;

pub(crate) const ADMIN: &str = "adm@example.test";
pub(crate) const REV: &str = "rev@example.test";
pub(crate) const REV2: &str = "rev2@example.test";
pub(crate) const ANA: &str = "ana@example.test";
pub(crate) const BO: &str = "bo@example.test";

/// One person of the plane: their email, API token and user id.
pub(crate) struct Person {
    pub email: &'static str,
    pub token: String,
    pub id: String,
}

/// A running review server with an admin, two reviewers and two members, each with a token
/// and a console password.
pub(crate) struct Plane {
    pub server: Server,
    pub admin: Person,
    pub rev: Person,
    pub rev2: Person,
    pub ana: Person,
    pub bo: Person,
}

impl Plane {
    pub(crate) fn start(world: &World, store: &StoreSel) -> Plane {
        let mut made = Vec::new();
        for (email, role) in [
            (ADMIN, "admin"),
            (REV, "reviewer"),
            (REV2, "reviewer"),
            (ANA, "member"),
            (BO, "member"),
        ] {
            let token = user_with_token(world, store, email, role);
            set_password(world, store, email, PW).expect_code(0);
            made.push((email, token));
        }
        let server = Server::start(world, store, &[]);
        let mut people = made.into_iter().map(|(email, token)| {
            let id = get(&server.base, &token, "/api/v1/me", &[]).json()["id"]
                .as_str()
                .unwrap()
                .to_string();
            Person { email, token, id }
        });
        let mut next = || people.next().unwrap();
        let (admin, rev, rev2, ana, bo) = (next(), next(), next(), next(), next());
        Plane { server, admin, rev, rev2, ana, bo }
    }

    pub(crate) fn base(&self) -> &str {
        &self.server.base
    }

    /// A signed-in curl browser for `p`.
    pub(crate) fn browser(&self, world: &World, p: &Person) -> Browser {
        let b = Browser::new(world, self.base(), p.email);
        let r = b.login(p.email, PW);
        assert_eq!(r.status, 303, "{} did not sign in: {}", p.email, r.body);
        b
    }
}

/// Posts `items` as one NDJSON batch for `token`; every item must be stored (200 or 207 with
/// only 201s).
pub(crate) fn ingest(world: &World, base: &str, token: &str, items: &[Value]) {
    let f = write_file(world.tmp.path(), "batch.ndjson", &ndjson(items));
    let r = post_events(base, token, &f, "application/x-ndjson", &[]);
    assert!(r.status == 200 || r.status == 207, "{}", r.body);
    for res in r.json()["results"].as_array().unwrap() {
        assert_eq!(res["code"], 201, "an item was not stored: {res}");
    }
}

/// An egress line at `ts` (the audit format's fields `airlock publish` sends).
pub(crate) fn eg(
    id: &str,
    ts: Micros,
    session: &str,
    seq: u64,
    host: &str,
    allowed: bool,
) -> Value {
    let t = format_micros(ts);
    json!({
        "id": id, "source": "egress", "type": if allowed { "connect" } else { "denied" },
        "ts": t, "session": session, "seq": seq,
        "payload": {"id": id, "ts": t, "repo": "payments", "host": host, "method": "CONNECT",
                    "port": 443, "allowed": allowed, "boot": "boot-1",
                    "reason": if allowed { "allowed" } else { "not_allowed" }}
    })
}

/// A session start record as the daemon writes it.
pub(crate) fn start_record(session: &str, ts: Micros, email: &str, id: &str) -> Value {
    let t = format_micros(ts);
    json!({"id": format!("{session}:start"), "source": "session", "type": "start", "ts": t,
           "session": session,
           "payload": {"id": format!("{session}:start"), "kind": "start", "ts": t,
                       "session": session, "boot": "boot-1", "email": email, "user_id": id,
                       "command": ["/usr/bin/claude", "--resume"], "agent": "claude",
                       "agent_version": "2.1.40", "repo": "payments",
                       "repo_path": "/home/ana/src/payments", "airlock_version": "0.1.0",
                       "policy_digest": "sha256:4f1c9e", "policy_layers": ["managed@sha256:1", "repo@sha256:2"],
                       "layers": ["userns", "seccomp", "landlock-fs(abi 6)"]}})
}

/// A session end record listing `transcripts` (`{path, file, bytes, sha256}`).
pub(crate) fn end_record(session: &str, ts: Micros, transcripts: Value) -> Value {
    let t = format_micros(ts);
    json!({"id": format!("{session}:end"), "source": "session", "type": "end", "ts": t,
           "session": session,
           "payload": {"id": format!("{session}:end"), "kind": "end", "ts": t, "session": session,
                       "boot": "boot-1", "repo": "payments", "exit_status": 0, "tunnels": 0,
                       "bytes_sent": 18234, "bytes_recv": 402113,
                       "quarantined": [{"path": ".git/hooks/pre-commit",
                                        "moved_to": format!("~/.airlock/quarantine/{session}/items/1")}],
                       "transcripts": transcripts}})
}

/// A `transcript.file` item for `file` of `session`.
pub(crate) fn transcript_file(session: &str, ts: Micros, file: &str, content: &[u8]) -> Value {
    json!({"id": format!("{session}:transcript:{file}"), "source": "session",
           "type": "transcript.file", "ts": format_micros(ts), "session": session,
           "payload": {"airlock_session": session, "file": file, "bytes": content.len(),
                       "sha256": sha(content)}})
}

pub(crate) fn sha(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

/// A fixture transcript's lines with their `timestamp`s moved to `t0` + 1 s per line, as
/// `claude` envelopes of Airlock session `session` from `file` (offsets counted), and the
/// file's bytes as published.
pub(crate) fn claude_file(
    fixture: &str,
    t0: Micros,
    session: &str,
    file: &str,
) -> (Vec<Value>, Vec<u8>) {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/transcripts")
        .join(fixture);
    let raw = std::fs::read_to_string(p).unwrap();
    let mut content = Vec::new();
    let mut out = Vec::new();
    for (i, l) in raw.lines().filter(|l| !l.trim().is_empty()).enumerate() {
        let mut v: Value = serde_json::from_str(l).unwrap();
        let ts = format_micros(t0 + i as Micros * SEC);
        if v.get("timestamp").is_some() {
            v["timestamp"] = json!(ts);
        }
        let line = v.to_string();
        let id = v["uuid"].as_str().map_or_else(|| format!("{file}:{i}"), str::to_string);
        out.push(json!({"id": id, "source": "claude", "type": v["type"], "ts": ts,
                        "session": v.get("sessionId").cloned().unwrap_or(json!("agent-sess")),
                        "airlock_session": session, "file": file, "offset": content.len(),
                        "payload": v}));
        content.extend_from_slice(line.as_bytes());
        content.push(b'\n');
    }
    (out, content)
}

/// `&amp;`-style entities of maud's escaping, undone.
pub(crate) fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

/// The text of some HTML (tags dropped, entities undone, whitespace folded).
pub(crate) fn text_of(html: &str) -> String {
    let mut out = String::new();
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => {
                in_tag = false;
                out.push(' ');
            }
            _ if !in_tag => out.push(c),
            _ => {}
        }
    }
    unescape(&out).split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The `<tbody>` rows of the first table whose opening tag starts with `table_open`, each as
/// its cells' texts.
pub(crate) fn table_rows(body: &str, table_open: &str) -> Vec<Vec<String>> {
    let Some(at) = body.find(table_open) else { return Vec::new() };
    let rest = &body[at..];
    let end = rest.find("</table>").unwrap_or(rest.len());
    let table = &rest[..end];
    let Some(tb) = table.find("<tbody>") else { return Vec::new() };
    table[tb..]
        .split("<tr")
        .skip(1)
        .map(|tr| tr.split("<td").skip(1).map(|td| text_of(&format!("<td{td}"))).collect())
        .collect()
}

/// The timeline rows' texts (one string per row), newest first as shown.
pub(crate) fn timeline_rows(body: &str) -> Vec<String> {
    table_rows(body, "<table class=\"tl\">").into_iter().map(|r| r.join(" | ")).collect()
}

/// The `href` of the page's `rel="next"` link, if any.
pub(crate) fn next_link(body: &str) -> Option<String> {
    let at = body.find("<a rel=\"next\" href=\"")?;
    let rest = &body[at + "<a rel=\"next\" href=\"".len()..];
    Some(unescape(&rest[..rest.find('"')?]))
}

/// The reader's console read records (`airlock.review.read`, `via: console`), as `admin`
/// sees them through the API.
pub(crate) fn console_reads(base: &str, admin: &str, reader: &str) -> Vec<Value> {
    all_events(base, admin, &format!("&user={reader}&source=external"))
        .into_iter()
        .filter(|e| e["type"] == "airlock.review.read" && e["payload"]["via"] == "console")
        .collect()
}

/// A page that must be a 200 with the console's headers, under the size cap.
pub(crate) fn page(b: &Browser, path: &str) -> Http {
    let r = b.get(path);
    assert_eq!(r.status, 200, "GET {path}: {}", r.body);
    assert_console_headers(&r);
    assert_eq!(header(&r, "content-type"), Some("text/html; charset=utf-8"), "{path}");
    assert_eq!(header(&r, "cache-control"), Some("no-store"), "{path}");
    assert!(r.body.len() < PAGE_MAX, "GET {path} is {} bytes", r.body.len());
    r
}

/// The ids of the flags of `user` the API lists (reviewer token).
fn flag_ids(base: &str, reviewer: &str, user: &str) -> Vec<String> {
    let r = get(base, reviewer, &format!("/api/v1/flags?limit=1000&user={user}"), &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["flags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_str().unwrap().to_string())
        .collect()
}

/// Ingests a denied egress to a paste site for `who` and returns the one new flag's id.
pub(crate) fn raise(world: &World, p: &Plane, who: &Person, id: &str, ts: Micros) -> String {
    let before = flag_ids(p.base(), &p.admin.token, &who.id);
    ingest(
        world,
        p.base(),
        &who.token,
        &[eg(id, ts, &format!("s-{id}"), 1, "pastebin.com", false)],
    );
    let after = flag_ids(p.base(), &p.admin.token, &who.id);
    let new: Vec<&String> = after.iter().filter(|f| !before.contains(f)).collect();
    assert_eq!(new.len(), 1, "one flag raised on {id}: {after:?}");
    new[0].clone()
}

// ---------------------------------------------------------------------------------------
// /people

fn people_suite(world: &World, store: &StoreSel) {
    let p = Plane::start(world, store);
    let base = p.base();
    let now = now_micros();
    let today = now - now.rem_euclid(DAY);
    // Always today, never in the future.
    let t_today = today + (now - today) / 2;
    let d3 = today - 3 * DAY + HOUR;
    let d10 = today - 10 * DAY + HOUR;
    ingest(
        world,
        base,
        &p.ana.token,
        &[
            eg("a1", t_today, "s-1", 1, "api.github.com", true),
            eg("a2", t_today, "s-1", 2, "crates.io", true),
            eg("a3", t_today, "s-1", 3, "pastebin.com", false),
            eg("a4", d3, "s-0", 1, "static.crates.io", true),
            eg("a5", d3, "s-0", 2, "blocked.example.test", false),
            eg("a6", d10, "s-x", 1, "old.example.test", true),
        ],
    );
    ingest(world, base, &p.bo.token, &[eg("b1", t_today, "s-b", 1, "pypi.org", true)]);

    // A reviewer sees everyone, with the counts.
    let rev = p.browser(world, &p.rev);
    let r = page(&rev, "/people");
    assert!(r.body.contains("signed in as rev@example.test (reviewer)"), "{}", r.body);
    let rows = table_rows(&r.body, "<table class=\"people\">");
    let row = |email: &str| {
        rows.iter()
            .find(|c| c[0] == email)
            .unwrap_or_else(|| panic!("no row of {email}: {rows:?}"))
            .clone()
    };
    for email in [ADMIN, REV, REV2, ANA, BO] {
        row(email);
    }
    assert_eq!(rows.len(), 5, "{rows:?}");
    let ana = row(ANA);
    assert_eq!(ana[1], "member", "{ana:?}");
    assert_eq!((ana[2].as_str(), ana[3].as_str()), ("3", "5"), "today and 7 days: {ana:?}");
    assert_eq!(ana[5], "2", "denied over 7 days: {ana:?}");
    assert_eq!(ana[6], "1 medium", "the paste-site flag is open: {ana:?}");
    assert!(ana[7].ends_with("ago"), "{ana:?}");
    let bo = row(BO);
    assert_eq!((bo[2].as_str(), bo[3].as_str(), bo[5].as_str()), ("1", "1", "0"), "{bo:?}");
    assert_eq!(bo[6], "none", "{bo:?}");
    assert!(r.body.contains(&format!("href=\"/people/{}\"", p.ana.id)), "links by user id");
    // Recorded in the reviewer's own history.
    let reads = console_reads(base, &p.admin.token, REV);
    assert!(
        reads.iter().any(|e| e["payload"]["what"] == "people"
            && e["payload"]["reader"] == json!(p.rev.id)
            && e["user_id"] == json!(p.rev.id)),
        "{reads:?}"
    );

    // A member sees only themself, and their view of it records nothing.
    let ana_b = p.browser(world, &p.ana);
    let r = page(&ana_b, "/people");
    let rows = table_rows(&r.body, "<table class=\"people\">");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0][0], ANA);
    for other in [BO, REV, REV2, ADMIN] {
        assert!(!r.body.contains(other), "a member saw {other}: {}", r.body);
    }
    assert!(!r.body.contains(&p.bo.id), "a member saw bo's id");
    let r = page(&ana_b, &format!("/people/{}", p.ana.id));
    assert!(r.body.contains("pastebin.com"), "{}", r.body);
    assert!(console_reads(base, &p.admin.token, ANA).is_empty(), "a member's own views");
}

#[test]
fn console_people_page_embedded() {
    if !have("curl") {
        return;
    }
    let world = World::new();
    people_suite(&world, &StoreSel::Embedded(world.tmp.path().join("d")));
}

#[test]
fn console_people_page_postgres() {
    if !have("curl") {
        return;
    }
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    people_suite(&world, &StoreSel::Pg(db.runtime_url.clone()));
}

// ---------------------------------------------------------------------------------------
// /people/{user_id}

fn timeline_suite(world: &World, store: &StoreSel) {
    let p = Plane::start(world, store);
    let base = p.base();
    let t0 = now_micros() - 2 * DAY;
    let t0 = t0 - t0.rem_euclid(HOUR);
    let at = |s: i64| t0 + s * SEC;
    let claude_line = |uuid: &str, ts: Micros, text: &str| {
        json!({"id": uuid, "source": "claude", "type": "user", "ts": format_micros(ts),
               "session": "agent-1", "airlock_session": "s-a",
               "payload": {"type": "user", "uuid": uuid, "sessionId": "agent-1",
                           "timestamp": format_micros(ts), "isSidechain": false,
                           "message": {"role": "user", "content": text}}})
    };
    // Sent out of `ts` order: the page orders by `ts`, not by arrival.
    let mut gh = eg("e-gh", at(60), "s-b", 2, "github.com", true);
    gh["payload"]["repo"] = json!("infra");
    let items = vec![
        gh,
        claude_line("c-1", at(20), "claude-marker: why does the build fail?"),
        eg("e-api", at(10), "s-a", 1, "api.github.com", true),
        json!({"id": "x-1", "source": "external", "type": "deploy.approved", "ts": format_micros(at(40)),
               "payload": {"note": "ext-marker", "by": "ci"}}),
        eg("e-paste", at(30), "s-a", 2, "pastebin.com", false),
        start_record("s-a", at(0), ANA, &p.ana.id),
        eg("e-evil", at(50), "s-b", 1, "evilgithub.com", true),
    ];
    ingest(world, base, &p.ana.token, &items);
    // Rows by what they show, newest first.
    let want_order = [
        "CONNECT github.com:443",
        "CONNECT evilgithub.com:443",
        "ext-marker",
        "CONNECT pastebin.com:443",
        "claude-marker",
        "CONNECT api.github.com:443",
        "session start: /usr/bin/claude --resume",
    ];
    let rev = p.browser(world, &p.rev);
    let tl = |query: &str| {
        let r = page(&rev, &format!("/people/{}{query}", p.ana.id));
        timeline_rows(&r.body)
    };
    let which = |rows: &[String]| -> Vec<&'static str> {
        want_order.iter().copied().filter(|w| rows.iter().any(|r| r.contains(w))).collect()
    };
    let rows = tl("");
    assert_eq!(rows.len(), 7, "{rows:#?}");
    for (i, w) in want_order.iter().enumerate() {
        assert!(rows[i].contains(w), "row {i} should show {w}: {rows:#?}");
    }
    assert!(rows[3].starts_with(&format_micros(at(30))), "the row's time is its ts: {rows:#?}");
    assert!(rows[3].contains("egress denied"), "{rows:#?}");
    assert!(rows[4].contains("claude user"), "{rows:#?}");
    let r = page(&rev, &format!("/people/{}", p.ana.id));
    assert!(r.body.contains("Timeline of ana@example.test"), "{}", r.body);
    assert!(r.body.contains("<tr class=\"no\">"), "the denied row is marked");
    assert!(
        r.body.contains(&format!("href=\"/sessions/s-a?user={}\"", p.ana.id)),
        "rows link their session's drill-down"
    );

    // Each filter narrows it.
    let cases: Vec<(String, Vec<&str>)> = vec![
        ("?source=egress".into(), vec![want_order[0], want_order[1], want_order[3], want_order[5]]),
        ("?type=deploy.approved".into(), vec!["ext-marker"]),
        ("?decision=denied".into(), vec![want_order[3]]),
        ("?decision=allowed".into(), vec![want_order[0], want_order[1], want_order[5]]),
        ("?host=github.com".into(), vec![want_order[0], want_order[5]]),
        ("?session=s-b".into(), vec![want_order[0], want_order[1]]),
        ("?session=s-a".into(), vec![want_order[3], want_order[4], want_order[5], want_order[6]]),
        (
            format!(
                "?from={}&until={}",
                format_micros(at(25)).replace(':', "%3A"),
                format_micros(at(55)).replace(':', "%3A")
            ),
            vec![want_order[1], want_order[2], want_order[3]],
        ),
        ("?repo=infra".into(), vec![want_order[0]]),
        ("?repo=payments".into(), vec![want_order[1], want_order[3], want_order[5], want_order[6]]),
        ("?q=claude-marker".into(), vec!["claude-marker"]),
        ("?q=CLAUDE-Marker".into(), vec!["claude-marker"]),
        ("?source=egress&decision=allowed&session=s-b".into(), vec![want_order[0], want_order[1]]),
        ("?q=nothing-like-this".into(), vec![]),
    ];
    for (q, want) in cases {
        let rows = tl(&q);
        assert_eq!(which(&rows), want, "{q}: {rows:#?}");
        assert_eq!(rows.len(), want.len(), "{q}: {rows:#?}");
    }
    for bad in ["?decision=maybe", "?source=nope", "?from=yesterday", "?cursor=zzz"] {
        let r = rev.get(&format!("/people/{}{bad}", p.ana.id));
        assert_eq!(r.status, 400, "{bad}: {}", r.body);
        assert_console_headers(&r);
    }
    // The filter form keeps the values.
    let r = page(&rev, &format!("/people/{}?host=github.com", p.ana.id));
    assert!(r.body.contains("name=\"host\" value=\"github.com\""), "{}", r.body);

    // The views are recorded, with their filters.
    let reads = console_reads(base, &p.admin.token, REV);
    let tl_reads: Vec<&Value> =
        reads.iter().filter(|e| e["payload"]["what"] == "timeline").collect();
    assert!(tl_reads.len() >= 16, "{tl_reads:?}");
    assert!(
        tl_reads.iter().all(|e| e["payload"]["target_user"] == json!(p.ana.id)
            && e["payload"]["target_email"] == ANA)
    );
    assert!(
        tl_reads.iter().any(|e| e["payload"]["filters"] == json!({"host": "github.com"})),
        "{tl_reads:?}"
    );

    // A member: another person's page is a 403 naming nobody, the same for an id nobody has.
    let ana = p.browser(world, &p.ana);
    let mine = page(&ana, &format!("/people/{}", p.ana.id));
    assert_eq!(timeline_rows(&mine.body).len(), 7 + 1, "their own, with the sign-in");
    // An event claiming a time an hour ahead of its receipt: marked backdated, and flagged.
    ingest(
        world,
        base,
        &p.ana.token,
        &[eg("e-future", now_micros() + HOUR, "s-c", 1, "ahead.example.test", true)],
    );
    let r = page(&rev, &format!("/people/{}", p.ana.id));
    let rows = timeline_rows(&r.body);
    assert!(rows[0].contains("CONNECT ahead.example.test:443"), "{rows:#?}");
    assert!(rows[0].contains("⚠") && rows[0].contains("⚑"), "{rows:#?}");
    assert!(r.body.contains("title=\"ts more than 5 minutes after receipt\""), "{}", r.body);
    assert!(!rows[1].contains("⚠"), "{rows:#?}");
    let theirs = ana.get(&format!("/people/{}", p.bo.id));
    assert_eq!(theirs.status, 403, "{}", theirs.body);
    assert_console_headers(&theirs);
    let nobody = ana.get("/people/u-does-not-exist");
    assert_eq!(nobody.status, 403, "{}", nobody.body);
    assert_eq!(theirs.body, nobody.body, "the 403 tells nothing about who exists");
    for leak in [BO, p.bo.id.as_str(), "u-does-not-exist"] {
        assert!(!theirs.body.contains(leak), "the 403 names {leak}: {}", theirs.body);
    }
    let by_email = ana.get(&format!("/people/{BO}"));
    assert_eq!(by_email.status, 403);
    assert!(!by_email.body.contains(BO));
    // A reviewer: 404 for an unknown id.
    let r = rev.get("/people/u-does-not-exist");
    assert_eq!(r.status, 404, "{}", r.body);
    assert_console_headers(&r);
}

#[test]
fn console_timeline_embedded() {
    if !have("curl") {
        return;
    }
    let world = World::new();
    timeline_suite(&world, &StoreSel::Embedded(world.tmp.path().join("d")));
}

#[test]
fn console_timeline_postgres() {
    if !have("curl") {
        return;
    }
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    timeline_suite(&world, &StoreSel::Pg(db.runtime_url.clone()));
}

/// 450 events, three per `ts`, paged by the "older" link: each exactly once, newest first.
fn paging_suite(world: &World, store: &StoreSel) {
    let p = Plane::start(world, store);
    let base = p.base();
    let t0 = now_micros() - DAY;
    let items: Vec<Value> = (0..450)
        .map(|i| {
            let ts = t0 + (i / 3) as Micros * SEC;
            eg(&format!("p-{i:03}"), ts, "s-p", i + 1, &format!("h-{i:03}.example.test"), true)
        })
        .collect();
    ingest(world, base, &p.bo.token, &items);
    for who in [&p.bo, &p.rev] {
        let b = p.browser(world, who);
        let mut path = format!("/people/{}", p.bo.id);
        let mut seen: Vec<usize> = Vec::new();
        let mut logins = 0;
        let mut pages = 0;
        loop {
            let r = page(&b, &path);
            pages += 1;
            let rows = timeline_rows(&r.body);
            assert!(rows.len() <= 200, "{} rows on one page", rows.len());
            for row in &rows {
                // bo's own sign-in is in his history too.
                if row.contains("airlock.auth.login") {
                    logins += 1;
                    continue;
                }
                let at = row.find("CONNECT h-").unwrap_or_else(|| panic!("{row}"));
                let n: usize = row[at + 10..at + 13].parse().unwrap();
                seen.push(n);
            }
            match next_link(&r.body) {
                Some(next) => {
                    assert!(next.starts_with(&format!("/people/{}?", p.bo.id)), "{next}");
                    path = next;
                }
                None => break,
            }
            assert!(pages < 10, "the older links never end");
        }
        let want: Vec<usize> = (0..450).rev().collect();
        assert_eq!(seen, want, "every event once, newest first, as {}", who.email);
        assert_eq!(pages, 3);
        assert_eq!(logins, 1, "the sign-in row once");
    }
    // Paging keeps the filters.
    let b = p.browser(world, &p.bo);
    let r = page(&b, &format!("/people/{}?source=egress&q=example.test", p.bo.id));
    let next = next_link(&r.body).unwrap();
    assert!(next.contains("source=egress") && next.contains("q=example.test"), "{next}");
    let r2 = page(&b, &next);
    let first = timeline_rows(&r2.body);
    assert!(first[0].contains("CONNECT h-249."), "{first:?}");
}

#[test]
fn console_timeline_paging_embedded() {
    if !have("curl") {
        return;
    }
    let world = World::new();
    paging_suite(&world, &StoreSel::Embedded(world.tmp.path().join("d")));
}

#[test]
fn console_timeline_paging_postgres() {
    if !have("curl") {
        return;
    }
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    paging_suite(&world, &StoreSel::Pg(db.runtime_url.clone()));
}

// ---------------------------------------------------------------------------------------
// /sessions/{session}

/// A whole Airlock session of `who`: start record, a Claude transcript with a subagent, egress
/// lines allowed and denied, its `transcript.file` items and end record.
pub(crate) fn publish_session(world: &World, base: &str, who: &Person, session: &str, t0: Micros) {
    let main = ".claude/projects/-home-ana-src-payments/b7d2e9a4.jsonl";
    let sub = ".claude/projects/-home-ana-src-payments/b7d2e9a4/subagents/agent-a1b2c3.jsonl";
    let (lines, content) = claude_file("claude-happy-path.jsonl", t0 + 5 * SEC, session, main);
    let (sub_lines, sub_content) =
        claude_file("claude-subagent.jsonl", t0 + 6 * SEC + SEC / 2, session, sub);
    let mut items = vec![start_record(session, t0, who.email, &who.id)];
    items.extend(lines);
    items.extend(sub_lines);
    items.push(eg(&format!("{session}-e1"), t0 + 7 * SEC, session, 1, "api.anthropic.com", true));
    items.push(eg(&format!("{session}-e2"), t0 + 8 * SEC, session, 2, "pastebin.com", false));
    items.push(eg(&format!("{session}-e3"), t0 + 9 * SEC, session, 3, "github.com", true));
    items.push(transcript_file(session, t0 + 20 * SEC, main, &content));
    items.push(transcript_file(session, t0 + 20 * SEC, sub, &sub_content));
    items.push(end_record(
        session,
        t0 + 30 * SEC,
        json!([
            {"path": format!("/home/ana/{main}"), "file": main, "bytes": content.len(), "sha256": sha(&content)},
            {"path": format!("/home/ana/{sub}"), "file": sub, "bytes": sub_content.len(), "sha256": sha(&sub_content)},
        ]),
    ));
    ingest(world, base, &who.token, &items);
}

fn session_suite(world: &World, store: &StoreSel) {
    let p = Plane::start(world, store);
    let base = p.base();
    let t0 = now_micros() - DAY;
    publish_session(world, base, &p.ana, "s-7f3a", t0);
    let rev = p.browser(world, &p.rev);
    let path = format!("/sessions/s-7f3a?user={}", p.ana.id);
    let r = page(&rev, &path);
    let body = &r.body;
    for want in [
        "Session s-7f3a",
        "/usr/bin/claude --resume",
        "claude 2.1.40",
        "sha256:4f1c9e",
        "managed@sha256:1, repo@sha256:2",
        "userns, seccomp, landlock-fs(abi 6)",
        ".git/hooks/pre-commit",
        "matches the session record",
        // The prompt, the answer, the tool call with its input, the tool result.
        "Why does the retry test flake? Check tests/retry_test.rs",
        "Reading the test first.",
        "Tool call: <code>Read</code>",
        "/home/ana/src/payments/tests/retry_test.rs",
        "<summary>Tool result</summary>",
        // The subagent nested.
        "Subagent <code>a1b2c3</code> · 2 lines",
        "sub task",
        // The egress rail, the denied attempt marked.
        "<div class=\"e no\">",
        "CONNECT pastebin.com",
        "CONNECT api.anthropic.com",
    ] {
        assert!(body.contains(want), "{want} missing:\n{body}");
    }
    assert!(!body.contains("No end record is stored"), "the end record is shown");
    let pos = |s: &str| body.find(s).unwrap_or_else(|| panic!("{s}"));
    assert!(pos("Why does the retry test flake?") < pos("Subagent"), "placed by time");
    assert!(pos("Subagent") < pos("CONNECT api.anthropic.com"));
    assert!(pos("CONNECT api.anthropic.com") < pos("CONNECT pastebin.com"));
    assert!(body.contains(&format!("/people/{}?session=s-7f3a", p.ana.id)), "timeline link");
    let reads = console_reads(base, &p.admin.token, REV);
    assert!(
        reads.iter().any(|e| e["payload"]["what"] == "session"
            && e["payload"]["session"] == "s-7f3a"
            && e["payload"]["target_user"] == json!(p.ana.id)),
        "{reads:?}"
    );
    // The owner sees it (without `user=` too); another member does not.
    let ana = p.browser(world, &p.ana);
    assert!(page(&ana, "/sessions/s-7f3a").body.contains("Reading the test first."));
    assert!(page(&ana, &path).body.contains("Reading the test first."));
    let bo = p.browser(world, &p.bo);
    let r = bo.get(&path);
    assert_eq!(r.status, 403, "{}", r.body);
    assert_console_headers(&r);
    for leak in [ANA, "Reading the test first.", "pastebin.com"] {
        assert!(!r.body.contains(leak), "the 403 shows {leak}: {}", r.body);
    }
    let r = bo.get(&format!("/sessions/s-7f3a?user={ANA}"));
    assert_eq!(r.status, 403, "by email too: {}", r.body);
    // bo's own session of that name does not exist.
    assert_eq!(bo.get("/sessions/s-7f3a").status, 404);
    // A reviewer: no such session of that person.
    let r = rev.get(&format!("/sessions/nope?user={}", p.ana.id));
    assert_eq!(r.status, 404, "{}", r.body);
}

#[test]
fn console_session_drill_down_embedded() {
    if !have("curl") {
        return;
    }
    let world = World::new();
    session_suite(&world, &StoreSel::Embedded(world.tmp.path().join("d")));
}

#[test]
fn console_session_drill_down_postgres() {
    if !have("curl") {
        return;
    }
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    session_suite(&world, &StoreSel::Pg(db.runtime_url.clone()));
}

// ---------------------------------------------------------------------------------------
// /flags

/// The rows of a flag's history table on the queue page, as text.
fn history_rows(body: &str) -> Vec<String> {
    body.split("<caption class=\"mut\">State history, oldest first</caption>")
        .skip(1)
        .flat_map(|t| {
            let t = &t[..t.find("</table>").unwrap_or(t.len())];
            t.split("<tr>").skip(2).map(text_of).collect::<Vec<_>>()
        })
        .collect()
}

fn flags_suite(world: &World, store: &StoreSel, pg: Option<&PgDb>) {
    let p = Plane::start(world, store);
    let base = p.base();
    let t0 = now_micros() - HOUR;
    let f1 = raise(world, &p, &p.ana, "fl-1", t0);
    let f2 = raise(world, &p, &p.ana, "fl-2", t0 + SEC);
    let f3 = raise(world, &p, &p.bo, "fl-3", t0 + 2 * SEC);
    let own = raise(world, &p, &p.rev, "fl-own", t0 + 3 * SEC);
    let rev = p.browser(world, &p.rev);
    let q = page(&rev, "/flags");
    assert!(q.body.contains("egress.paste-or-tunnel-host"), "{}", q.body);
    assert!(q.body.contains(ANA) && q.body.contains(BO));
    assert!(q.body.contains(&format!("action=\"/flags/{f1}\"")), "{}", q.body);
    assert!(q.body.contains("ask another reviewer or an admin"), "own flag not offered");
    assert!(!q.body.contains(&format!("action=\"/flags/{own}\"")), "{}", q.body);
    let csrf = csrf_of(&q.body);
    let hist = |f: &str| listed(base, &p.admin.token, f)["history"].as_array().unwrap().len();

    // Refused forms change nothing.
    let no_csrf = rev.post(&format!("/flags/{f1}"), &[("action", "acknowledge"), ("note", "x")]);
    assert_eq!(no_csrf.status, 403, "{}", no_csrf.body);
    assert_console_headers(&no_csrf);
    let wrong = rev.post(
        &format!("/flags/{f1}"),
        &[("csrf", &"0".repeat(64)), ("action", "acknowledge"), ("note", "x")],
    );
    assert_eq!(wrong.status, 403, "{}", wrong.body);
    for note in ["", "   "] {
        let r = rev.post(
            &format!("/flags/{f1}"),
            &[("csrf", &csrf), ("action", "acknowledge"), ("note", note)],
        );
        assert_eq!(r.status, 400, "{note:?}: {}", r.body);
        assert!(r.body.contains("A note is required"), "{}", r.body);
    }
    let r =
        rev.post(&format!("/flags/{f1}"), &[("csrf", &csrf), ("action", "burn"), ("note", "x")]);
    assert_eq!(r.status, 400, "{}", r.body);
    let r =
        rev.post("/flags/no-such-flag", &[("csrf", &csrf), ("action", "resolve"), ("note", "x")]);
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(hist(&f1), 0, "refused forms appended nothing");
    assert_eq!(listed(base, &p.admin.token, &f1)["state"], "open");

    // Acknowledge with a note: 303 to the queue, which shows it, as does the API.
    let r = rev.post(
        &format!("/flags/{f1}"),
        &[("csrf", &csrf), ("action", "acknowledge"), ("note", "checked with ana <b>ok</b>")],
    );
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(header(&r, "location"), Some("/flags"));
    assert_console_headers(&r);
    let v = listed(base, &p.admin.token, &f1);
    assert_eq!(v["state"], "acknowledged", "{v}");
    assert_eq!(v["history"][0]["actor"], json!(p.rev.id), "{v}");
    assert_eq!(v["history"][0]["note"], "checked with ana <b>ok</b>", "{v}");
    assert_eq!(v["history"][0]["self"], false, "{v}");
    let q = page(&rev, "/flags?state=");
    let h = history_rows(&q.body);
    assert!(
        h.iter().any(|r| r.contains("acknowledged")
            && r.contains(REV)
            && r.contains("checked with ana <b>ok</b>")),
        "{h:?}"
    );
    assert!(q.body.contains("checked with ana &lt;b&gt;ok&lt;/b&gt;"), "the note is escaped");
    // The open queue no longer lists it.
    let open = page(&rev, "/flags?state=open");
    assert!(!open.body.contains(&format!("action=\"/flags/{f1}\"")), "{}", open.body);

    // Assign through the form.
    let r = rev.post(
        &format!("/flags/{f1}"),
        &[("csrf", &csrf), ("action", "assign"), ("assignee", REV2)],
    );
    assert_eq!(r.status, 303, "{}", r.body);
    let v = listed(base, &p.admin.token, &f1);
    assert_eq!((&v["state"], &v["assignee_email"]), (&json!("acknowledged"), &json!(REV2)), "{v}");
    assert_eq!(v["history"][1]["action"], "assign");
    assert_eq!(v["history"][1]["actor"], json!(p.rev.id));
    let q = page(&rev, "/flags?state=");
    assert!(q.body.contains("assigned to rev2@example.test"), "{}", q.body);
    let h = history_rows(&q.body);
    assert!(
        h.iter().any(|r| r.contains("assigned to rev2@example.test") && r.contains(REV)),
        "{h:?}"
    );
    let r = rev.post(
        &format!("/flags/{f1}"),
        &[("csrf", &csrf), ("action", "assign"), ("assignee", "ghost@example.test")],
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(hist(&f1), 2);

    // Bulk: two flags resolved by one form (a flag named twice is acted on once).
    let r = rev.post(
        "/flags/bulk",
        &[
            ("csrf", &csrf),
            ("action", "resolve"),
            ("note", "both benign"),
            ("flag", &f2),
            ("flag", &f3),
            ("flag", &f2),
        ],
    );
    assert_eq!(r.status, 303, "{}", r.body);
    for f in [&f2, &f3] {
        let v = listed(base, &p.admin.token, f);
        assert_eq!((&v["state"], &v["note"]), (&json!("resolved"), &json!("both benign")), "{v}");
        assert_eq!(v["actor"], json!(p.rev.id), "{v}");
        assert_eq!(hist(f), 1, "one row per flag: {v}");
    }
    let r = rev.post("/flags/bulk", &[("action", "reopen"), ("note", "x"), ("flag", &f2)]);
    assert_eq!(r.status, 403, "bulk without csrf: {}", r.body);
    let r = rev
        .post("/flags/bulk", &[("csrf", &csrf), ("action", "reopen"), ("note", ""), ("flag", &f2)]);
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(listed(base, &p.admin.token, &f2)["state"], "resolved");

    // Their own flag: refused while another reviewer exists (here: rev2 and the admin).
    let r = rev.post(
        &format!("/flags/{own}"),
        &[("csrf", &csrf), ("action", "dismiss"), ("note", "mine, fine")],
    );
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.body.contains("your own history"), "{}", r.body);
    let r = rev.post(
        &format!("/flags/{own}"),
        &[("csrf", &csrf), ("action", "assign"), ("assignee", REV)],
    );
    assert_eq!(r.status, 403, "{}", r.body);
    let r = rev.post(
        "/flags/bulk",
        &[("csrf", &csrf), ("action", "dismiss"), ("note", "mine"), ("flag", &own)],
    );
    assert!(r.body.contains("1 flag(s) not changed"), "{}", r.body);
    assert_eq!(hist(&own), 0, "{}", listed(base, &p.admin.token, &own));
    // PostgreSQL: the store's own function re-checks a console session as it does a token,
    // whatever the server decided.
    if let Some(db) = pg {
        let call = |secret: &str, flag: &str| {
            db.runtime_sql(&format!(
                "SELECT actor FROM airlock_flag_state('{secret}', '{flag}', 'dismissed', 'direct', false)"
            ))
        };
        let sid = rev.session().expect("the reviewer's session id");
        let e = call(&sid, &own).unwrap_err();
        assert!(e.contains("raised on your own history"), "{e}");
        let e = call(&"0".repeat(64), &own).unwrap_err();
        assert!(e.contains("invalid or revoked credential"), "{e}");
        let ana = p.browser(world, &p.ana);
        let e = call(&ana.session().unwrap(), &f3).unwrap_err();
        assert!(e.contains("only reviewers and admins"), "{e}");
        let ended = p.browser(world, &p.rev);
        let sid2 = ended.session().unwrap();
        let csrf3 = csrf_of(&page(&ended, "/people").body);
        assert_eq!(ended.post("/logout", &[("csrf", &csrf3)]).status, 303);
        let e = call(&sid2, &f3).unwrap_err();
        assert!(e.contains("invalid or revoked credential"), "a logged-out session: {e}");
        assert_eq!(hist(&own), 0);
        assert_eq!(hist(&f3), 1, "only the bulk row");
    }
    // Another reviewer may.
    let rev2 = p.browser(world, &p.rev2);
    let csrf2 = csrf_of(&page(&rev2, "/flags").body);
    let r = rev2.post(
        &format!("/flags/{own}"),
        &[("csrf", &csrf2), ("action", "acknowledge"), ("note", "rev2 looks")],
    );
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(listed(base, &p.admin.token, &own)["actor"], json!(p.rev2.id));
    // One session's csrf is not another's.
    let r =
        rev2.post(&format!("/flags/{f2}"), &[("csrf", &csrf), ("action", "reopen"), ("note", "x")]);
    assert_eq!(r.status, 403, "{}", r.body);

    // Members read their own flags only, and act on none.
    let ana = p.browser(world, &p.ana);
    let q = page(&ana, "/flags?state=");
    assert!(q.body.contains("egress.paste-or-tunnel-host"));
    assert!(!q.body.contains(BO), "a member saw another's flag: {}", q.body);
    assert!(!q.body.contains("method=\"post\" action=\"/flags/"), "no forms for members");
    let r = ana.post(
        &format!("/flags/{f1}"),
        &[("csrf", &csrf_of(&q.body)), ("action", "resolve"), ("note", "mine")],
    );
    assert_eq!(r.status, 403, "{}", r.body);
    assert_eq!(hist(&f1), 2);
}

#[test]
fn console_flags_queue_embedded() {
    if !have("curl") {
        return;
    }
    let world = World::new();
    flags_suite(&world, &StoreSel::Embedded(world.tmp.path().join("d")), None);
}

#[test]
fn console_flags_queue_postgres() {
    if !have("curl") {
        return;
    }
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    flags_suite(&world, &StoreSel::Pg(db.runtime_url.clone()), Some(&db));
}

// ---------------------------------------------------------------------------------------
// /access-log and /export

fn access_and_export_suite(world: &World, store: &StoreSel) {
    let p = Plane::start(world, store);
    let base = p.base();
    let t0 = now_micros() - HOUR;
    let items = vec![
        eg("x-1", t0, "s-x", 1, "api.github.com", true),
        eg("x-2", t0 + SEC, "s-x", 2, "blocked.example.test", false),
        // Cells a spreadsheet would run as formulas.
        json!({"id": "=HYPERLINK(\"http://evil.example\",\"x\")", "source": "external",
               "type": "@SUM(A1)", "ts": format_micros(t0 + 2 * SEC), "payload": -1}),
        json!({"id": "x-4", "source": "external", "type": "note", "ts": format_micros(t0 + 3 * SEC),
               "payload": {"text": "a, \"quoted\"\nline"}}),
    ];
    ingest(world, base, &p.ana.token, &items);
    let rev = p.browser(world, &p.rev);
    page(&rev, &format!("/people/{}?host=github.com", p.ana.id));

    // JSONL: the header line, then one line per event.
    let want: Vec<String> = all_events(base, &p.admin.token, &format!("&user={}", p.ana.id))
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(want.len(), 4, "{want:?}");
    let r = rev.get(&format!("/export?user={}&format=jsonl", p.ana.id));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_console_headers(&r);
    assert_eq!(header(&r, "content-type"), Some("application/x-ndjson"));
    assert!(
        header(&r, "content-disposition")
            .is_some_and(|d| d.starts_with("attachment; filename=\"airlock-export-")),
        "{}",
        r.headers
    );
    let mut lines: Vec<Value> = r.body.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    // The last line closes the export (docs/evidence.md "Exports"), counting its events.
    let end = lines.pop().unwrap();
    assert_eq!(end["end"]["events"], json!(lines.len() - 1), "{end}");
    assert_eq!(lines[0]["export"]["via"], "console", "{}", lines[0]);
    assert_eq!(lines[0]["export"]["query"]["user"], json!(p.ana.id), "{}", lines[0]);
    assert_eq!(lines[0]["export"]["by"], json!(p.rev.id), "{}", lines[0]);
    let mut got: Vec<String> =
        lines[1..].iter().map(|e| e["id"].as_str().unwrap().to_string()).collect();
    let mut want_sorted = want.clone();
    got.sort();
    want_sorted.sort();
    assert_eq!(got, want_sorted, "one line per event");
    assert!(lines[1..].iter().all(|e| e["user_id"] == json!(p.ana.id)));
    // Narrowed by source.
    let r = rev.get(&format!("/export?user={}&format=jsonl&source=egress", p.ana.id));
    let ids: Vec<String> = r
        .body
        .lines()
        .skip(1)
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|l| l.get("end").is_none())
        .map(|l| l["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, vec!["x-1".to_string(), "x-2".to_string()], "{}", r.body);

    // CSV: the column row, one row per event, formulas defused.
    let r = rev.get(&format!("/export?user={}&format=csv", p.ana.id));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_console_headers(&r);
    assert_eq!(header(&r, "content-type"), Some("text/csv; charset=utf-8"));
    let rows = csv_records(&r.body);
    assert_eq!(
        rows[0],
        "pk,user_id,source,id,type,ts,session,seq,boot,received_at,airlock_session,file,offset,conflict_of,payload"
            .split(',')
            .map(str::to_string)
            .collect::<Vec<_>>()
    );
    assert_eq!(rows.len(), 1 + want.len(), "{:?}", rows);
    let formula = rows.iter().find(|r| r[3].contains("HYPERLINK")).unwrap();
    assert!(formula[3].starts_with("'="), "{formula:?}");
    assert!(formula[4].starts_with("'@"), "{formula:?}");
    assert_eq!(formula[14], "'-1", "{formula:?}");
    assert!(
        r.body.contains("\"'=HYPERLINK(\"\"http://evil.example\"\",\"\"x\"\")\""),
        "{}",
        r.body
    );
    assert!(r.body.contains(",\"'-1\"\r\n"), "{}", r.body);
    let quoted = rows.iter().find(|r| r[3] == "x-4").unwrap();
    let payload: Value = serde_json::from_str(&quoted[14]).unwrap();
    assert_eq!(payload["text"], "a, \"quoted\"\nline", "{quoted:?}");
    let r = rev.get(&format!("/export?user={}&format=xml", p.ana.id));
    assert_eq!(r.status, 400);

    // Exports are recorded in the exporter's history; one's own included.
    let ana = p.browser(world, &p.ana);
    let r = ana.get("/export?format=jsonl");
    assert_eq!(r.status, 200, "{}", r.body);
    let r = ana.get(&format!("/export?user={}&format=jsonl", p.bo.id));
    assert_eq!(r.status, 403, "a member exported another's history: {}", r.body);
    assert_console_headers(&r);
    assert!(!r.body.contains(BO));
    let exports = |who: &str| -> Vec<Value> {
        all_events(base, &p.admin.token, &format!("&user={who}&source=external"))
            .into_iter()
            .filter(|e| e["type"] == "airlock.review.export")
            .collect()
    };
    let rev_exports = exports(REV);
    assert_eq!(rev_exports.len(), 3, "the refused format is not an export: {rev_exports:?}");
    assert!(rev_exports.iter().all(
        |e| e["payload"]["via"] == "console" && e["payload"]["target_user"] == json!(p.ana.id)
    ));
    assert!(rev_exports.iter().any(|e| e["payload"]["format"] == "csv"));
    let ana_exports = exports(ANA);
    assert_eq!(ana_exports.len(), 1, "{ana_exports:?}");
    assert_eq!(ana_exports[0]["payload"]["via"], "console");

    // The access log: admins only, every recorded read with reader, what and whose.
    for who in [&p.rev, &p.ana] {
        let b = if who.email == REV { &rev } else { &ana };
        let r = b.get("/access-log");
        assert_eq!(r.status, 403, "{} read the access log: {}", who.email, r.body);
        assert_console_headers(&r);
        assert!(!r.body.contains("timeline"), "{}", r.body);
        assert!(
            !page(b, "/people").body.contains("href=\"/access-log\""),
            "no link for {}",
            who.email
        );
    }
    let adm = p.browser(world, &p.admin);
    let r = page(&adm, "/access-log");
    assert!(r.body.contains("href=\"/access-log\" aria-current=\"page\""), "{}", r.body);
    let rows = table_rows(&r.body, "<table class=\"access\">");
    // (reader, what, via, whose)
    let has = |reader: &str, what: &str, via: &str, whose: &str| {
        rows.iter().any(|c| c[1] == reader && c[2] == what && c[3] == via && c[4] == whose)
    };
    assert!(has(REV, "timeline", "console", ANA), "{rows:#?}");
    assert!(has(REV, "people", "console", "everyone"), "{rows:#?}");
    assert!(has(REV, "export", "console", ANA), "{rows:#?}");
    assert!(has(ANA, "export", "console", ANA), "{rows:#?}");
    assert!(
        rows.iter().any(|c| c[1] == ADMIN && c[3] == "api" && c[4] == ANA),
        "the API reads too: {rows:#?}"
    );
    let timeline = rows.iter().find(|c| c[2] == "timeline").unwrap();
    assert!(timeline[5].contains("github.com"), "the filters are shown: {timeline:?}");
    assert!(r.body.contains(&format!("<a href=\"/people/{}\">{ANA}</a>", p.ana.id)));
}

/// RFC 4180 records (quoted cells may hold commas, quotes and newlines; CRLF ends a record).
fn csv_records(body: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rec = Vec::new();
    let mut cell = String::new();
    let mut quoted = false;
    let mut chars = body.chars().peekable();
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                cell.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => cell.push(c),
            (false, '"') => quoted = true,
            (false, ',') => rec.push(std::mem::take(&mut cell)),
            (false, '\r') => {}
            (false, '\n') => {
                rec.push(std::mem::take(&mut cell));
                out.push(std::mem::take(&mut rec));
            }
            (false, c) => cell.push(c),
        }
    }
    assert!(cell.is_empty() && rec.is_empty(), "the last record is not terminated");
    out
}

#[test]
fn console_access_log_and_export_embedded() {
    if !have("curl") {
        return;
    }
    let world = World::new();
    access_and_export_suite(&world, &StoreSel::Embedded(world.tmp.path().join("d")));
}

#[test]
fn console_access_log_and_export_postgres() {
    if !have("curl") {
        return;
    }
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    access_and_export_suite(&world, &StoreSel::Pg(db.runtime_url.clone()));
}
