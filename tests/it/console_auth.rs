//! Console sign-in (issue 17, docs/console.md) through the real `airlockd review` on loopback
//! and curl with a cookie jar, on both stores: passwords set from stdin, the session cookie's
//! exact attributes, wrong passwords (401, an `airlock.auth.login_failed` event in that user's
//! history), unknown emails (no event anywhere; PostgreSQL: a row in the capped auth log),
//! CSRF (403), logout, a role change, a token revocation and idle expiry each ending the
//! session, single-use invites, the sign-in rate limit (429 + Retry-After), the security
//! headers, a cookie never authenticating `/api/*`, and reserved `airlock.auth.*` types
//! refused at ingest.

use crate::review_support::*;
use crate::support::{Run, World, have};
use serde_json::{Value, json};
use std::io::Write;
use std::path::PathBuf;
use std::process::Stdio;

const SESSION: &str = "__Host-airlock_session";

/// `airlockd admin user set-password --password-stdin` with `password` piped in.
pub(crate) fn set_password(world: &World, store: &StoreSel, email: &str, password: &str) -> Run {
    let mut t = world
        .airlockd(world.tmp.path())
        .args(["admin", "user", "set-password", "--email", email, "--password-stdin"])
        .args(store.admin_args());
    t.cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = t.cmd.spawn().unwrap();
    child.stdin.take().unwrap().write_all(password.as_bytes()).unwrap();
    Run { output: child.wait_with_output().unwrap() }
}

fn admin(world: &World, store: &StoreSel, args: &[&str]) -> Run {
    world.airlockd(world.tmp.path()).args(args).args(store.admin_args()).run()
}

/// A browser stand-in: curl with its own cookie jar.
pub(crate) struct Browser {
    pub(crate) base: String,
    pub(crate) jar: PathBuf,
    /// Extra curl arguments (`--cacert` for TLS).
    extra: Vec<String>,
}

impl Browser {
    pub(crate) fn new(world: &World, base: &str, name: &str) -> Self {
        Self {
            base: base.to_string(),
            jar: world.tmp.path().join(format!("jar-{name}")),
            extra: Vec::new(),
        }
    }

    pub(crate) fn get(&self, path: &str) -> Http {
        let jar = self.jar.display().to_string();
        let mut args: Vec<&str> = vec!["-b", &jar, "-c", &jar];
        args.extend(self.extra.iter().map(String::as_str));
        let url = format!("{}{path}", self.base);
        args.push(&url);
        curl(&args)
    }

    pub(crate) fn post(&self, path: &str, fields: &[(&str, &str)]) -> Http {
        let jar = self.jar.display().to_string();
        let mut args: Vec<String> = vec!["-b".into(), jar.clone(), "-c".into(), jar];
        args.extend(self.extra.iter().cloned());
        // An empty form is still a POST of an empty body.
        args.extend(["--data-raw".into(), String::new()]);
        for (k, v) in fields {
            args.extend(["--data-urlencode".into(), format!("{k}={v}")]);
        }
        args.push(format!("{}{path}", self.base));
        curl(&args.iter().map(String::as_str).collect::<Vec<_>>())
    }

    /// Signs in through the form; the answer to the POST.
    pub(crate) fn login(&self, email: &str, password: &str) -> Http {
        let form = self.get("/login");
        assert_eq!(form.status, 200, "{}", form.body);
        let csrf = csrf_of(&form.body);
        self.post("/login", &[("csrf", &csrf), ("email", email), ("password", password)])
    }

    /// The session id in the jar, if any.
    pub(crate) fn session(&self) -> Option<String> {
        let jar = std::fs::read_to_string(&self.jar).unwrap_or_default();
        jar.lines().find_map(|l| {
            let cols: Vec<&str> = l.split('\t').collect();
            (cols.len() == 7 && cols[5] == SESSION && !cols[6].is_empty())
                .then(|| cols[6].to_string())
        })
    }
}

/// The hidden `csrf` value of a page's form.
pub(crate) fn csrf_of(body: &str) -> String {
    let at = body.find("name=\"csrf\" value=\"").unwrap_or_else(|| panic!("no csrf: {body}"));
    let rest = &body[at + "name=\"csrf\" value=\"".len()..];
    rest[..rest.find('"').unwrap()].to_string()
}

fn header_lines<'a>(r: &'a Http, name: &str) -> Vec<&'a str> {
    r.headers
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
        .collect()
}

pub(crate) fn header<'a>(r: &'a Http, name: &str) -> Option<&'a str> {
    header_lines(r, name).into_iter().next()
}

/// `/people` with exactly this session cookie (no jar): signed in, or sent to `/login`.
fn people_with(base: &str, session: &str) -> Http {
    curl(&["-H", &format!("Cookie: {SESSION}={session}"), &format!("{base}/people")])
}

fn assert_signed_out(base: &str, session: &str, why: &str) {
    let r = people_with(base, session);
    assert_eq!(r.status, 303, "{why}: the old cookie still works: {}", r.body);
    assert_eq!(header(&r, "location"), Some("/login"), "{why}");
}

pub(crate) fn assert_console_headers(r: &Http) {
    assert_eq!(
        header(r, "content-security-policy"),
        Some("default-src 'self'; frame-ancestors 'none'"),
        "{}",
        r.headers
    );
    assert_eq!(header(r, "x-content-type-options"), Some("nosniff"));
    assert_eq!(header(r, "referrer-policy"), Some("no-referrer"));
}

fn auth_events(base: &str, reviewer: &str, email: &str) -> Vec<Value> {
    all_events(base, reviewer, &format!("&user={email}&source=external"))
        .into_iter()
        .filter(|e| e["type"].as_str().is_some_and(|t| t.starts_with("airlock.auth.")))
        .collect()
}

fn count(events: &[Value], kind: &str) -> usize {
    events.iter().filter(|e| e["type"] == kind).count()
}

const PW: &str = "correct horse battery";

fn sign_in_and_sessions(world: &World, store: &StoreSel, pg: Option<&PgDb>) {
    let _admin = user_with_token(world, store, "admin@example.test", "admin");
    let reviewer = user_with_token(world, store, "rev@example.test", "reviewer");
    let member = user_with_token(world, store, "m@example.test", "member");
    for u in ["m2@example.test", "rl@example.test", "inv@example.test"] {
        admin(world, store, &["admin", "user", "add", "--email", u, "--role", "member"])
            .expect_code(0);
    }

    // --- Passwords from stdin: the rule, then argon2id. ---
    let short = set_password(world, store, "m@example.test", "short\n").expect_code(1);
    assert!(short.stderr().contains("at least 12 characters"), "{}", short.stderr());
    let empty = set_password(world, store, "m@example.test", "\n").expect_code(1);
    assert!(empty.stderr().contains("empty"), "{}", empty.stderr());
    for u in ["m@example.test", "m2@example.test", "rl@example.test"] {
        set_password(world, store, u, &format!("{PW}\n")).expect_code(0);
    }
    if let Some(db) = pg {
        let phc = db.owner_sql("SELECT phc FROM user_passwords LIMIT 1").unwrap();
        assert!(phc.starts_with("$argon2id$v=19$"), "{phc}");
    }

    let server = Server::start(
        world,
        store,
        &["--login-attempts-per-account", "3", "--login-attempts-per-address", "1000"],
    );
    let base = server.base.as_str();

    // --- Sign in: 303 to /people with exactly the cookie; the headers on every page. ---
    let b = Browser::new(world, base, "m");
    let form = b.get("/login");
    assert_console_headers(&form);
    assert_eq!(header(&form, "content-type"), Some("text/html; charset=utf-8"));
    let r = b.login("m@example.test", PW);
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(header(&r, "location"), Some("/people"));
    assert_console_headers(&r);
    let cookie = header_lines(&r, "set-cookie")
        .into_iter()
        .find(|c| c.starts_with(SESSION))
        .unwrap_or_else(|| panic!("no session cookie: {}", r.headers))
        .to_string();
    let id = b.session().expect("the jar holds the session");
    assert_eq!(id.len(), 64, "256 bits as hex");
    assert_eq!(cookie, format!("{SESSION}={id}; Secure; Path=/; HttpOnly; SameSite=Strict"));
    let people = b.get("/people");
    assert_eq!(people.status, 200, "{}", people.body);
    assert!(people.body.contains("signed in as m@example.test (member)"), "{}", people.body);
    assert_console_headers(&people);
    // Only its SHA-256 is stored.
    if let Some(db) = pg {
        let n = db
            .owner_sql(&format!(
                "SELECT count(*) FROM console_sessions WHERE hash = sha256('{id}'::bytea)"
            ))
            .unwrap();
        assert_eq!(n, "1", "the session row is keyed by the id's SHA-256");
        let raw = db
            .owner_sql(&format!(
                "SELECT count(*) FROM console_sessions WHERE hash = convert_to('{id}', 'UTF8')"
            ))
            .unwrap();
        assert_eq!(raw, "0");
    }

    // --- A cookie never authenticates the API (state-changing or not). ---
    let jar = b.jar.display().to_string();
    let me = curl(&["-b", &jar, &format!("{base}/api/v1/me")]);
    assert_eq!(me.status, 401, "{}", me.body);
    let batch =
        write_file(world.tmp.path(), "c1.ndjson", &ndjson(&[egress("c1", "example.test", true)]));
    let ingest = curl(&[
        "-b",
        &jar,
        "-H",
        "Content-Type: application/x-ndjson",
        "--data-binary",
        &format!("@{}", batch.display()),
        &format!("{base}/api/v1/events"),
    ]);
    assert_eq!(ingest.status, 401, "{}", ingest.body);

    // --- CSRF: a POST without or with a wrong csrf is 403. ---
    let other = Browser::new(world, base, "csrf");
    other.get("/login");
    let r = other.post("/login", &[("email", "m@example.test"), ("password", PW)]);
    assert_eq!(r.status, 403, "{}", r.body);
    assert_console_headers(&r);
    let r = other.post(
        "/login",
        &[("csrf", &"0".repeat(64)), ("email", "m@example.test"), ("password", PW)],
    );
    assert_eq!(r.status, 403, "{}", r.body);
    assert_eq!(b.post("/logout", &[]).status, 403, "logout without csrf");
    assert_eq!(b.post("/logout", &[("csrf", &"0".repeat(64))]).status, 403);
    assert_eq!(b.get("/people").status, 200, "refused logouts ended nothing");

    // --- Wrong password: 401, the form again, an event in that user's history. ---
    let w = Browser::new(world, base, "wrong");
    let r = w.login("m@example.test", "not the password at all");
    assert_eq!(r.status, 401, "{}", r.body);
    assert!(r.body.contains("The email or the password is wrong."), "{}", r.body);
    assert!(r.body.contains("name=\"csrf\""), "the form again");
    assert!(w.session().is_none());
    let evs = auth_events(base, &reviewer, "m@example.test");
    assert_eq!(count(&evs, "airlock.auth.login"), 1, "{evs:?}");
    assert_eq!(count(&evs, "airlock.auth.login_failed"), 1, "{evs:?}");
    let failed = evs.iter().find(|e| e["type"] == "airlock.auth.login_failed").unwrap();
    assert_eq!(failed["source"], "external");
    assert_eq!(failed["payload"]["address"], "127.0.0.1");

    // --- Unknown email: the same answer, no event anywhere (PostgreSQL: the auth log). ---
    // The reviewer's own reads are recorded as they go; nothing else may appear.
    let others = |evs: &[Value]| evs.iter().filter(|e| e["type"] != "airlock.review.read").count();
    let before = others(&all_events(base, &reviewer, "&source=external"));
    let r = w.login("nobody@example.test", PW);
    assert_eq!(r.status, 401, "{}", r.body);
    assert!(r.body.contains("The email or the password is wrong."), "the same answer");
    let after = all_events(base, &reviewer, "&source=external");
    assert_eq!(others(&after), before, "{after:?}");
    assert!(!after.iter().any(|e| e.to_string().contains("nobody@example.test")), "{after:?}");
    if let Some(db) = pg {
        let n = db
            .owner_sql("SELECT count(*) FROM auth_log WHERE email = 'nobody@example.test'")
            .unwrap();
        assert_eq!(n, "1");
    }

    // --- Logout ends the session: the old cookie no longer works. ---
    let people = b.get("/people");
    let r = b.post("/logout", &[("csrf", &csrf_of(&people.body))]);
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(header(&r, "location"), Some("/login"));
    assert_signed_out(base, &id, "logout");
    assert_eq!(count(&auth_events(base, &reviewer, "m@example.test"), "airlock.auth.logout"), 1);

    // --- A role change ends the session. ---
    let b2 = Browser::new(world, base, "m2");
    assert_eq!(b2.login("m2@example.test", PW).status, 303);
    let id2 = b2.session().unwrap();
    assert_eq!(people_with(base, &id2).status, 200);
    admin(
        world,
        store,
        &["admin", "user", "set-role", "--email", "m2@example.test", "--role", "reviewer"],
    )
    .expect_code(0);
    assert_signed_out(base, &id2, "role change");
    // Signing in again works, with the new role.
    assert_eq!(b2.login("m2@example.test", PW).status, 303);
    assert!(b2.get("/people").body.contains("(reviewer)"));

    // --- A token revocation ends the session. ---
    let b3 = Browser::new(world, base, "m3");
    assert_eq!(b3.login("m@example.test", PW).status, 303);
    let id3 = b3.session().unwrap();
    assert_eq!(people_with(base, &id3).status, 200);
    admin(world, store, &["admin", "token", "revoke", "--user", "m@example.test"]).expect_code(0);
    assert_signed_out(base, &id3, "token revocation");

    // --- Rate limit per account: 3 failures, then 429 with Retry-After, even for the
    // right password. ---
    let rl = Browser::new(world, base, "rl");
    for _ in 0..3 {
        assert_eq!(rl.login("rl@example.test", "wrong wrong wrong").status, 401);
    }
    for pw in ["wrong wrong wrong", PW] {
        let r = rl.login("rl@example.test", pw);
        assert_eq!(r.status, 429, "{}", r.body);
        let after: u64 = header(&r, "retry-after").unwrap().parse().unwrap();
        assert!(after >= 1);
        assert_console_headers(&r);
    }
    assert!(rl.session().is_none());
    let m = curl(&[&format!("{base}/metrics")]);
    assert!(
        m.body.contains("airlock_review_rate_limited_total{limit=\"login_per_account\"} 2"),
        "the two refused sign-ins are not counted in /metrics:\n{}",
        m.body
    );

    // --- Invites: a one-time link whose page sets the password and signs in. ---
    let run = admin(
        world,
        store,
        &["admin", "user", "invite", "--email", "inv@example.test", "--url", &format!("{base}/")],
    )
    .expect_code(0);
    let link = run.stdout().trim().to_string();
    let path = link.strip_prefix(base).unwrap_or_else(|| panic!("{link}")).to_string();
    assert!(path.starts_with("/invite/") && path.len() == "/invite/".len() + 64, "{path}");
    let token = &path["/invite/".len()..];
    if let Some(db) = pg {
        let n = db
            .owner_sql(&format!(
                "SELECT count(*) FROM invites WHERE hash = sha256('{token}'::bytea)"
            ))
            .unwrap();
        assert_eq!(n, "1", "stored as its SHA-256");
    }
    let inv = Browser::new(world, base, "inv");
    let page = inv.get(&path);
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("inv@example.test"));
    let csrf = csrf_of(&page.body);
    let r = inv.post(&path, &[("password", "new password 123"), ("password2", "new password 123")]);
    assert_eq!(r.status, 403, "an invite POST without csrf");
    let r =
        inv.post(&path, &[("csrf", &csrf), ("password", "too short"), ("password2", "too short")]);
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("at least 12"), "{}", r.body);
    let r = inv.post(
        &path,
        &[("csrf", &csrf), ("password", "new password 123"), ("password2", "new password 123")],
    );
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(header(&r, "location"), Some("/people"));
    assert!(inv.get("/people").body.contains("signed in as inv@example.test (member)"));
    // Single use.
    assert_eq!(inv.get(&path).status, 404);
    let again = inv.post(
        &path,
        &[("csrf", &csrf), ("password", "another password 1"), ("password2", "another password 1")],
    );
    assert_eq!(again.status, 404, "{}", again.body);
    let fresh = Browser::new(world, base, "inv2");
    assert_eq!(fresh.login("inv@example.test", "new password 123").status, 303);
    assert_eq!(fresh.login("inv@example.test", "another password 1").status, 401);

    // --- Reserved airlock.auth.* types cannot be ingested. ---
    let m2_token = token_for(world, store, "m2@example.test");
    let item = json!({"source": "external", "id": "fake-login", "type": "airlock.auth.login",
        "ts": "2026-03-04T09:12:05.118Z", "payload": {"email": "m2@example.test"}});
    let body = write_file(world.tmp.path(), "reserved.ndjson", &ndjson(&[item]));
    let r = post_events(base, &m2_token, &body, "application/x-ndjson", &[]);
    assert_eq!(r.status, 207, "{}", r.body);
    let res = &r.json()["results"][0];
    assert_eq!(res["code"], 403, "{res}");
    assert!(res["error"].as_str().unwrap().contains("reserved"), "{res}");
    drop(server);

    // --- Idle expiry: a short --console-idle-timeout ends an unused session. ---
    let server = Server::start(world, store, &["--console-idle-timeout", "2s"]);
    let idle = Browser::new(world, &server.base, "idle");
    assert_eq!(idle.login("m2@example.test", PW).status, 303);
    let idle_id = idle.session().unwrap();
    assert_eq!(people_with(&server.base, &idle_id).status, 200);
    std::thread::sleep(std::time::Duration::from_secs(3));
    assert_signed_out(&server.base, &idle_id, "idle expiry");
    let _ = member;
}

#[test]
fn console_sign_in_and_sessions_embedded() {
    if !have("curl") {
        return;
    }
    let world = World::new();
    sign_in_and_sessions(&world, &StoreSel::Embedded(world.tmp.path().join("d")), None);
}

#[test]
fn console_sign_in_and_sessions_postgres() {
    if !have("curl") {
        return;
    }
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    sign_in_and_sessions(&world, &StoreSel::Pg(db.runtime_url.clone()), Some(&db));
}

/// The console's tables hold the grants of docs/review.md ("Grants"): the runtime role cannot
/// write a password, an invite use or the auth log except through the SECURITY DEFINER
/// functions, the admin role cannot forge a session, and even the owner cannot rewrite or
/// delete any of it (the ring's rows are overwritten only by `airlock_auth_log`).
#[test]
fn console_tables_keep_least_privilege_postgres() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    let store = StoreSel::Pg(db.runtime_url.clone());
    user_with_token(&world, &store, "a@example.test", "admin");
    let uid = db.owner_sql("SELECT id FROM users").unwrap();
    let denied = |r: Result<String, String>, sql: &str| {
        let e = r.unwrap_err();
        assert!(e.contains("permission denied"), "{sql}: {e}");
    };
    for sql in [
        format!("INSERT INTO user_passwords(user_id, phc, at) VALUES ('{uid}', '$argon2id$x', 0)"),
        format!(
            "INSERT INTO invites(hash, user_id, created_at, expires_at) VALUES ('\\x00', '{uid}', 0, 9e15)"
        ),
        "INSERT INTO invite_uses(hash, at) VALUES ('\\x00', 0)".into(),
        "INSERT INTO auth_log(slot, seq, address, email) VALUES (1, 1, 'a', 'b')".into(),
        "SELECT * FROM auth_log".into(),
        "UPDATE console_sessions SET role = 'admin'".into(),
        "DELETE FROM console_session_ends".into(),
    ] {
        denied(db.runtime_sql(&sql), &sql);
    }
    for sql in [
        format!(
            "INSERT INTO console_sessions(hash, user_id, role, epoch, created_at) VALUES ('\\x00', '{uid}', 'admin', 0, 0)"
        ),
        "INSERT INTO invite_uses(hash, at) VALUES ('\\x00', 0)".into(),
        "SELECT airlock_auth_log('x', 'y')".into(),
    ] {
        denied(db.admin_sql(&sql), &sql);
    }
    // The functions: an unknown invite consumes nothing; the ring takes a row.
    assert_eq!(
        db.runtime_sql("SELECT airlock_accept_invite('\\x00', '$argon2id$v=19$x')").unwrap(),
        ""
    );
    db.runtime_sql("SELECT airlock_auth_log('nobody@example.test', '127.0.0.1')").unwrap();
    assert_eq!(db.owner_sql("SELECT count(*) FROM auth_log").unwrap(), "1");
    // A valid invite is consumed once, by the function alone.
    db.admin_sql(&format!(
        "INSERT INTO invites(hash, user_id, created_at, expires_at) VALUES ('\\x01', '{uid}', 0, 9e15)"
    ))
    .unwrap();
    let once = "SELECT airlock_accept_invite('\\x01', '$argon2id$v=19$x')";
    assert_eq!(db.runtime_sql(once).unwrap(), uid);
    assert_eq!(db.runtime_sql(once).unwrap(), "", "single use");
    assert_eq!(db.owner_sql("SELECT count(*) FROM user_passwords").unwrap(), "1");
    // The owner is stopped by the triggers too.
    for sql in [
        "UPDATE user_passwords SET phc = 'x'",
        "DELETE FROM invite_uses",
        "DELETE FROM auth_log",
        "TRUNCATE auth_log",
        "TRUNCATE console_sessions CASCADE",
    ] {
        let e = db.owner_sql(sql).unwrap_err();
        assert!(e.contains("insert-only"), "{sql}: {e}");
    }
}

/// Over TLS the same sign-in works and sets the same cookie (and signing out ends it).
#[test]
fn console_sign_in_over_tls_embedded() {
    if !have("curl") {
        return;
    }
    let world = World::new();
    let store = StoreSel::Embedded(world.tmp.path().join("d"));
    user_with_token(&world, &store, "ana@example.test", "admin");
    set_password(&world, &store, "ana@example.test", PW).expect_code(0);
    let (cert, key) = crate::review_support::init_tls(&world);
    let (c, k) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let server = Server::start_scheme(&world, &store, &["--tls-cert", c, "--tls-key", k], "https");
    let mut b = Browser::new(&world, &server.base, "tls");
    b.extra = vec!["--cacert".into(), c.into()];
    let r = b.login("ana@example.test", PW);
    assert_eq!(r.status, 303, "{}", r.body);
    let id = b.session().unwrap();
    let cookie = header_lines(&r, "set-cookie").into_iter().find(|c| c.starts_with(SESSION));
    assert_eq!(
        cookie,
        Some(format!("{SESSION}={id}; Secure; Path=/; HttpOnly; SameSite=Strict").as_str())
    );
    let people = b.get("/people");
    assert!(people.body.contains("signed in as ana@example.test (admin)"), "{}", people.body);
    assert_console_headers(&people);
    let r = b.post("/logout", &[("csrf", &csrf_of(&people.body))]);
    assert_eq!(r.status, 303);
    assert_eq!(b.get("/people").status, 303, "signed out");
}

/// The console's stylesheet and script are served from the binary to anyone (the sign-in page
/// needs the stylesheet): the right types under `nosniff`, revalidated by strong ETag
/// (`If-None-Match` → 304, weak form and lists too), nothing else allowed; `/favicon.ico` is
/// an empty 204, not a 404 page; the pages link only these first-party assets.
#[test]
fn embedded_assets_are_served_with_etags() {
    if !have("curl") {
        return;
    }
    let world = World::new();
    let store = StoreSel::Embedded(world.tmp.path().join("d"));
    let _admin = user_with_token(&world, &store, "admin@example.test", "admin");
    let server = Server::start(&world, &store, &[]);
    let base = server.base.as_str();
    for (path, kind, needle) in [
        ("/assets/console.css", "text/css; charset=utf-8", ":root{"),
        ("/assets/console.js", "text/javascript; charset=utf-8", "(function(){"),
    ] {
        let r = curl(&[&format!("{base}{path}")]);
        assert_eq!(r.status, 200, "{path}: {}", r.headers);
        assert_eq!(header(&r, "content-type"), Some(kind), "{path}");
        assert_eq!(header(&r, "cache-control"), Some("no-cache"), "{path}");
        assert!(r.body.starts_with(needle), "{path}: {}", r.body);
        assert_console_headers(&r);
        let etag = header(&r, "etag").unwrap_or_else(|| panic!("{path}: no ETag")).to_string();
        assert!(etag.starts_with('"') && etag.ends_with('"') && etag.len() == 34, "{etag}");
        for sent in [etag.clone(), format!("W/{etag}"), format!("\"other\", {etag}"), "*".into()] {
            let again = curl(&["-H", &format!("If-None-Match: {sent}"), &format!("{base}{path}")]);
            assert_eq!(again.status, 304, "{path} with If-None-Match: {sent}");
            assert!(again.body.is_empty(), "{path}: a 304 has no body");
            assert_eq!(header(&again, "etag"), Some(etag.as_str()));
        }
        let stale = curl(&["-H", "If-None-Match: \"0123\"", &format!("{base}{path}")]);
        assert_eq!(stale.status, 200, "{path}: a different tag gets the asset");
        let post = curl(&["-X", "POST", &format!("{base}{path}")]);
        assert_eq!(post.status, 405, "{path}");
        assert_eq!(header(&post, "allow"), Some("GET"));
    }
    let icon = curl(&[&format!("{base}/favicon.ico")]);
    assert_eq!(icon.status, 204, "{}", icon.headers);
    assert!(icon.body.is_empty());
    let login = curl(&[&format!("{base}/login")]);
    assert!(
        login.body.contains(r#"<link rel="stylesheet" href="/assets/console.css">"#),
        "{}",
        login.body
    );
    assert!(!login.body.contains("http://") && !login.body.contains("https://"), "{}", login.body);
}
