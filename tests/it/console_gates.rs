//! The console's `/gates` page (docs/console.md "/gates") through the real `airlockd review`,
//! on both stores: with curl and a cookie jar — the queue lists each pending gate with its
//! digest, exact action and the requester's recent events; a member sees only their own gates
//! and is offered no approval of them; a reviewer's view of others' gates is recorded before it
//! is shown; the decision form (csrf, digest, note, step-up) approves and denies through the
//! API's own decision path, and every refusal (no csrf, no note, another digest, one's own
//! gate, a high gate without or with a wrong password, no longer pending) decides nothing;
//! hostile action text stays text. Then in a headless Chromium: a reviewer approves (a high
//! gate with the password again) and denies through the forms.

use crate::browser;
use crate::console_auth::{assert_console_headers, csrf_of, header};
use crate::console_pages::{
    ADMIN, ANA, BO, Person, Plane, REV, console_reads, eg, ingest, page, text_of,
};
use crate::review_gates::open_gate;
use crate::review_support::*;
use crate::support::{World, have};
use airlock::review::{Micros, now_micros};
use serde_json::{Value, json};

const SEC: Micros = 1_000_000;
/// The console password of every [`Plane`] person.
const PW: &str = "correct horse battery";
/// An action text no page may turn into markup.
const HOSTILE: &str = r#"git push <script>window.__xss=1</script> "quoted" 'single' &amp;"#;

/// A gate as the API answers it now.
fn gate(base: &str, token: &str, id: &str) -> Value {
    let r = get(base, token, &format!("/api/v1/gates/{id}"), &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

fn state(base: &str, token: &str, id: &str) -> String {
    gate(base, token, id)["state"].as_str().unwrap().to_string()
}

fn id_of(g: &Value) -> String {
    g["id"].as_str().unwrap().to_string()
}

fn digest_of(g: &Value) -> String {
    g["digest"].as_str().unwrap().to_string()
}

/// The `<section>` of gate `id` on a `/gates` page (empty when it is not listed).
fn section<'a>(body: &'a str, id: &str) -> &'a str {
    let open = format!("<section class=\"gate\" id=\"g-{id}\"");
    let Some(at) = body.find(&open) else { return "" };
    let rest = &body[at..];
    &rest[..rest.find("</section>").unwrap_or(rest.len())]
}

/// A tool gate of `session` (the capture plane's canonical text) for `who`.
fn tool_gate(base: &str, who: &Person, session: &str, attempt: &str, action: &str) -> Value {
    let canonical =
        airlock::gate::ToolAction { session, attempt, tool: "Bash", action }.canonical();
    open_gate(
        base,
        &who.token,
        &json!({"kind": "tool", "action": canonical, "repo": "payments", "rule": "git push",
                "severity": "medium", "timeout": 900}),
    )
}

fn external_gate(base: &str, who: &Person, action: &str, severity: &str) -> Value {
    open_gate(base, &who.token, &json!({"action": action, "severity": severity, "timeout": 900}))
}

fn gates_page_suite(world: &World, store: &StoreSel) {
    let p = Plane::start(world, store);
    let base = p.base();
    let now = now_micros();
    // Ana's recent history: what a reviewer reads beside her gate.
    ingest(
        world,
        base,
        &p.ana.token,
        &[
            eg("ana-1", now - 120 * SEC, "s-ana", 1, "api.github.com", true),
            eg("ana-2", now - 60 * SEC, "s-ana", 2, "pastebin.com", false),
        ],
    );
    ingest(world, base, &p.bo.token, &[eg("bo-1", now - 30 * SEC, "s-bo", 1, "pypi.org", true)]);
    let tool = tool_gate(base, &p.ana, "s-ana", "q1", HOSTILE);
    let tool_id = id_of(&tool);
    let bo_gate = external_gate(base, &p.bo, "publish bo's package 1.2", "low");
    let bo_id = id_of(&bo_gate);
    let own = external_gate(base, &p.rev, "rotate rev's signing key", "medium");
    let own_id = id_of(&own);
    let high = external_gate(base, &p.ana, "refund 12,000 EUR", "high");
    let high_id = id_of(&high);

    // Signed out: sent to sign in.
    let r = curl(&[&format!("{base}/gates")]);
    assert_eq!((r.status, header(&r, "location")), (303, Some("/login")), "{}", r.body);

    // --- A reviewer's queue. ---
    let rev = p.browser(world, &p.rev);
    let q = page(&rev, "/gates");
    assert!(q.body.contains(r#"<a href="/gates" aria-current="page">Gates</a>"#), "{}", q.body);
    for id in [&tool_id, &bo_id, &own_id, &high_id] {
        assert!(!section(&q.body, id).is_empty(), "gate {id} not listed: {}", q.body);
    }
    // Oldest first.
    let at = |id: &str| q.body.find(&format!("id=\"g-{id}\"")).unwrap();
    assert!(at(&tool_id) < at(&bo_id) && at(&bo_id) < at(&own_id) && at(&own_id) < at(&high_id));
    let s = section(&q.body, &tool_id);
    let text = text_of(s);
    assert!(s.contains(&digest_of(&tool)), "the digest is shown: {s}");
    assert!(s.contains(&format!(
        "<input type=\"hidden\" name=\"digest\" value=\"{}\">",
        digest_of(&tool)
    )));
    assert!(text.contains(&format!("Bash: {HOSTILE}")), "the target: {text}");
    assert!(text.contains(tool["action"].as_str().unwrap()), "the canonical text, in full");
    assert!(s.contains(&format!("href=\"/sessions/s-ana?user={}\"", p.ana.id)), "{s}");
    assert!(s.contains(&format!("href=\"/people/{}\"", p.ana.id)), "{s}");
    assert!(text.contains(ANA) && text.contains("git push") && text.contains("payments"));
    // Ana's recent events, newest first: her gates' own steps, then her egress.
    assert!(text.contains("Recent events of ana@example.test, newest first"), "{text}");
    let (paste, github) =
        (text.find("CONNECT pastebin.com:443").unwrap(), text.find("CONNECT api.github.com:443"));
    assert!(paste < github.unwrap(), "newest first: {text}");
    assert!(text.contains("requested: refund 12,000 EUR"), "the gate step rows: {text}");
    assert!(s.contains("value=\"approve\"") && s.contains("value=\"deny\""), "{s}");
    assert!(!s.contains("name=\"password\""), "medium: no step-up field");
    // Hostile action text is escaped everywhere it appears.
    assert!(!q.body.contains("<script>window.__xss"), "{}", q.body);
    assert!(
        q.body.contains("git push &lt;script&gt;window.__xss=1&lt;/script&gt; &quot;quoted&quot;"),
        "{}",
        q.body
    );
    assert!(s.contains("&amp;amp;"), "an entity in the action is shown as typed: {s}");
    // The high gate asks for the password again; the reviewer's own gate offers no approval.
    let hs = section(&q.body, &high_id);
    assert!(hs.contains("Your password, again") && hs.contains("name=\"password\""), "{hs}");
    let os = section(&q.body, &own_id);
    assert!(!os.contains("value=\"approve\"") && os.contains("value=\"deny\""), "{os}");
    assert!(os.contains("another reviewer or an admin approves it"), "{os}");
    assert!(!q.body.contains("name=\"override\""), "override is for an admin's own gate");
    // The view of ana's and bo's gates and timelines was recorded, naming them.
    let reads: Vec<Value> = console_reads(base, &p.admin.token, REV)
        .into_iter()
        .filter(|e| e["payload"]["what"] == "gates")
        .collect();
    assert_eq!(reads.len(), 1, "one record per page view: {reads:?}");
    let rp = &reads[0]["payload"];
    let targets = rp["target_users"].as_array().unwrap();
    assert!(targets.contains(&json!(p.ana.id)) && targets.contains(&json!(p.bo.id)), "{rp}");
    assert!(!targets.contains(&json!(p.rev.id)), "not one's own: {rp}");
    assert_eq!(
        (rp["via"].as_str(), rp["reader"].as_str()),
        (Some("console"), Some(p.rev.id.as_str()))
    );
    assert!(rp["pending"].as_array().unwrap().contains(&json!(tool_id)), "{rp}");

    // --- A member: their own gates only, no approval offered, nothing recorded. ---
    let ana = p.browser(world, &p.ana);
    let a = page(&ana, "/gates");
    assert!(!section(&a.body, &tool_id).is_empty() && !section(&a.body, &high_id).is_empty());
    for (id, leak) in [(&bo_id, "publish bo"), (&own_id, "rotate rev")] {
        assert!(section(&a.body, id).is_empty() && !a.body.contains(leak), "{}", a.body);
    }
    assert!(!a.body.contains(BO) && !a.body.contains(&p.bo.id), "{}", a.body);
    assert!(!a.body.contains("value=\"approve\""), "a member approves nothing of their own");
    assert!(section(&a.body, &tool_id).contains("value=\"deny\""), "but may deny");
    assert!(console_reads(base, &p.admin.token, ANA).is_empty(), "a member's own view");
    let acsrf = csrf_of(&a.body);
    let r = ana.post(
        &format!("/gates/{bo_id}"),
        &[("csrf", &acsrf), ("digest", &digest_of(&bo_gate)), ("note", "x"), ("action", "deny")],
    );
    assert_eq!(r.status, 404, "another's gate does not exist for a member: {}", r.body);
    assert!(!r.body.contains("publish bo"), "{}", r.body);
    let r = ana.post(
        &format!("/gates/{tool_id}"),
        &[("csrf", &acsrf), ("digest", &digest_of(&tool)), ("note", "mine"), ("action", "approve")],
    );
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(text_of(&r.body).contains("nobody approves their own"), "{}", r.body);
    assert_eq!(state(base, &p.rev.token, &bo_id), "pending");
    assert_eq!(state(base, &p.rev.token, &tool_id), "pending");

    // --- Refused forms decide nothing. ---
    let csrf = csrf_of(&q.body);
    let tool_digest = digest_of(&tool);
    let form = |csrf: &str, digest: &str, note: &str, action: &str| {
        vec![
            ("csrf".to_string(), csrf.to_string()),
            ("digest".to_string(), digest.to_string()),
            ("note".to_string(), note.to_string()),
            ("action".to_string(), action.to_string()),
        ]
    };
    let post = |b: &crate::console_auth::Browser, id: &str, fields: &[(String, String)]| {
        let f: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let r = b.post(&format!("/gates/{id}"), &f);
        assert_console_headers(&r);
        r
    };
    let mut no_csrf = form(&csrf, &tool_digest, "ok", "approve");
    no_csrf.remove(0);
    let r = post(&rev, &tool_id, &no_csrf);
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.body.contains("Form refused"), "{}", r.body);
    let r = post(&rev, &tool_id, &form(&"0".repeat(64), &tool_digest, "ok", "approve"));
    assert_eq!(r.status, 403, "a wrong csrf: {}", r.body);
    let r = post(&rev, &tool_id, &form(&acsrf, &tool_digest, "ok", "approve"));
    assert_eq!(r.status, 403, "another session's csrf: {}", r.body);
    for note in ["", "   "] {
        let r = post(&rev, &tool_id, &form(&csrf, &tool_digest, note, "approve"));
        assert_eq!(r.status, 400, "{note:?}: {}", r.body);
        assert!(r.body.contains("a note is required"), "{}", r.body);
        assert!(!section(&r.body, &tool_id).is_empty(), "the page is shown again: {}", r.body);
    }
    let r = post(&rev, &tool_id, &form(&csrf, "sha256:0000", "ok", "approve"));
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(text_of(&r.body).contains("not the one on the page you decided from"), "{}", r.body);
    let mut no_digest = form(&csrf, "", "ok", "approve");
    no_digest.remove(1);
    let r = post(&rev, &tool_id, &no_digest);
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("no digest"), "{}", r.body);
    for action in ["abandon", "maybe", ""] {
        let r = post(&rev, &tool_id, &form(&csrf, &tool_digest, "ok", action));
        assert_eq!(r.status, 400, "{action:?}: {}", r.body);
    }
    // The reviewer's own gate, with another reviewer present: the rule's message.
    let r = post(&rev, &own_id, &form(&csrf, &digest_of(&own), "mine, fine", "approve"));
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(text_of(&r.body).contains("nobody approves their own"), "{}", r.body);
    let mut with_override = form(&csrf, &digest_of(&own), "mine", "approve");
    with_override.push(("override".into(), "true".into()));
    let r = post(&rev, &own_id, &with_override);
    assert_eq!(r.status, 403, "override is an admin's: {}", r.body);
    assert!(text_of(&r.body).contains("admins only"), "{}", r.body);
    // A high gate: no password, a wrong one.
    let hd = digest_of(&high);
    let r = post(&rev, &high_id, &form(&csrf, &hd, "refund ok", "approve"));
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(text_of(&r.body).contains("needs your password again"), "{}", r.body);
    let mut wrong = form(&csrf, &hd, "refund ok", "approve");
    wrong.push(("password".into(), "not my password".into()));
    let r = post(&rev, &high_id, &wrong);
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(text_of(&r.body).contains("The password is wrong"), "{}", r.body);
    for id in [&tool_id, &own_id, &high_id] {
        assert_eq!(state(base, &p.rev.token, id), "pending", "{id}");
    }

    // --- Decisions through the form. ---
    let r = post(
        &rev,
        &tool_id,
        &form(&csrf, &tool_digest, "pushed to <b>main</b> is fine", "approve"),
    );
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(header(&r, "location"), Some(format!("/gates?decided={tool_id}").as_str()));
    let v = gate(base, &p.ana.token, &tool_id);
    assert_eq!(v["state"], "approved", "{v}");
    let d = &v["decision"];
    assert_eq!(
        (d["by"].as_str(), d["by_email"].as_str()),
        (Some(p.rev.id.as_str()), Some(REV)),
        "{v}"
    );
    assert_eq!(d["note"], "pushed to <b>main</b> is fine", "{v}");
    assert_eq!((d["self"].as_bool(), d["step_up"].as_bool()), (Some(false), Some(false)), "{v}");
    // The confirmation reads the store, and the decided table shows it.
    let c = page(&rev, &format!("/gates?decided={tool_id}"));
    let ct = text_of(&c.body);
    assert!(ct.contains(&format!("Gate {tool_id} (Bash: git push")), "{ct}");
    assert!(ct.contains("is approved by rev@example.test."), "{ct}");
    assert!(section(&c.body, &tool_id).is_empty(), "no longer pending");
    assert!(c.body.contains("pushed to &lt;b&gt;main&lt;/b&gt; is fine"), "the note, escaped");
    // Single use: the same form again is refused with the state it is in.
    let r = post(&rev, &tool_id, &form(&csrf, &tool_digest, "again", "deny"));
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(text_of(&r.body).contains("is approved by rev@example.test at"), "{}", r.body);
    // Deny.
    let r = post(&rev, &bo_id, &form(&csrf, &digest_of(&bo_gate), "not during the freeze", "deny"));
    assert_eq!(r.status, 303, "{}", r.body);
    let v = gate(base, &p.bo.token, &bo_id);
    assert_eq!(
        (v["state"].as_str(), v["decision"]["by_email"].as_str()),
        (Some("denied"), Some(REV))
    );
    assert_eq!(v["decision"]["note"], "not during the freeze");
    // The high gate with the right password: recorded as a step-up.
    let mut right = form(&csrf, &hd, "refund approved by finance", "approve");
    right.push(("password".into(), PW.into()));
    let r = post(&rev, &high_id, &right);
    assert_eq!(r.status, 303, "{}", r.body);
    let v = gate(base, &p.ana.token, &high_id);
    assert_eq!(
        (v["state"].as_str(), v["decision"]["step_up"].as_bool()),
        (Some("approved"), Some(true)),
        "{v}"
    );
    // A member denies their own gate (marked self); an admin approves their own with override.
    let mine = external_gate(base, &p.ana, "ana's second step", "medium");
    let a = page(&ana, "/gates");
    let r = post(
        &ana,
        &id_of(&mine),
        &form(&csrf_of(&a.body), &digest_of(&mine), "changed my mind", "deny"),
    );
    assert_eq!(r.status, 303, "{}", r.body);
    let v = gate(base, &p.ana.token, &id_of(&mine));
    assert_eq!(
        (v["state"].as_str(), v["decision"]["self"].as_bool()),
        (Some("denied"), Some(true))
    );
    let adm = p.browser(world, &p.admin);
    let adm_gate = external_gate(base, &p.admin, "admin's own step", "medium");
    let ag = page(&adm, "/gates");
    let s = section(&ag.body, &id_of(&adm_gate));
    assert!(
        s.contains("name=\"override\" value=\"true\"") && s.contains("value=\"approve\""),
        "{s}"
    );
    let mut f = form(&csrf_of(&ag.body), &digest_of(&adm_gate), "break glass", "approve");
    let r = post(&adm, &id_of(&adm_gate), &f);
    assert_eq!(r.status, 403, "without the override: {}", r.body);
    f.push(("override".into(), "true".into()));
    let r = post(&adm, &id_of(&adm_gate), &f);
    assert_eq!(r.status, 303, "{}", r.body);
    let v = gate(base, &p.admin.token, &id_of(&adm_gate));
    assert_eq!(
        (v["state"].as_str(), v["decision"]["self"].as_bool()),
        (Some("approved"), Some(true))
    );
    // The decided table, newest first, with the marks.
    let d = page(&rev, "/gates");
    let rows = crate::console_pages::table_rows(&d.body, "<table class=\"decided\">");
    assert!(rows.len() >= 5, "{rows:?}");
    assert!(rows[0][4].contains(ADMIN) && rows[0][4].contains("(self)"), "{rows:?}");
    let high_row = rows.iter().find(|r| r[3].contains(&high_id)).unwrap();
    assert!(high_row[4].contains("(step-up)") && high_row[5] == "refund approved by finance");
    assert_eq!(state(base, &p.rev.token, &own_id), "pending", "refused forms decided nothing");

    // --- Methods and paths. ---
    let r = rev.post("/gates", &[("csrf", &csrf)]);
    assert_eq!((r.status, header(&r, "allow")), (405, Some("GET")), "{}", r.body);
    let r = rev.get(&format!("/gates/{own_id}"));
    assert_eq!((r.status, header(&r, "allow")), (405, Some("POST")), "{}", r.body);
    let r = rev.post("/gates/gt_..%2F", &[("csrf", &csrf)]);
    assert_eq!(r.status, 404, "{}", r.body);
    let r = post(&rev, "gt_nosuchgate", &form(&csrf, "sha256:00", "x", "deny"));
    assert_eq!(r.status, 404, "{}", r.body);
    let r = rev.get("/gates?cursor=x");
    assert_eq!(r.status, 400, "{}", r.body);
    // A forged confirmation link shows nothing it cannot read from the store.
    let r = page(&rev, &format!("/gates?decided={own_id}"));
    assert!(!r.body.contains("role=\"status\""), "{own_id} is not decided: {}", r.body);
}

#[test]
fn console_gates_page_embedded() {
    if !have("curl") {
        return;
    }
    let world = World::new();
    gates_page_suite(&world, &StoreSel::Embedded(world.tmp.path().join("d")));
}

#[test]
fn console_gates_page_postgres() {
    if !have("curl") {
        return;
    }
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    gates_page_suite(&world, &StoreSel::Pg(db.runtime_url.clone()));
}

// ---------------------------------------------------------------------------------------
// In a real browser.

/// Signs `b` in as `p` through the form; lands on `/people`.
fn sign_in_as(b: &browser::Browser, base: &str, p: &Person) {
    b.delete_cookies();
    b.goto(&format!("{base}/login"));
    b.get("input[name=email]").type_text(p.email);
    b.get("input[name=password]").type_text(PW);
    b.click_and_wait("button[type=submit]");
    assert!(b.url().ends_with("/people"), "{} did not sign in: {}", p.email, b.source());
}

fn decide_in_browser(world: &World, store: &StoreSel) {
    let p = Plane::start(world, store);
    let base = p.base();
    ingest(
        world,
        base,
        &p.ana.token,
        &[eg("ana-b1", now_micros() - 60 * SEC, "s-ana", 1, "pastebin.com", false)],
    );
    let tool = tool_gate(base, &p.ana, "s-ana", "q7", HOSTILE);
    let high = external_gate(base, &p.ana, "refund 12,000 EUR to card 4242", "high");
    let bo = external_gate(base, &p.bo, "publish bo's package 1.2", "low");
    let b = browser::Browser::start();
    sign_in_as(&b, base, &p.rev);
    b.click_and_wait("header nav a[href='/gates']");
    assert!(b.url().ends_with("/gates"), "{}", b.url());
    assert_eq!(b.eval("return typeof window.__xss", json!([])), "undefined", "the action ran");
    let shown = b.eval(
        "return document.querySelector(arguments[0]).innerText",
        json!([format!("section#g-{} pre.req", id_of(&tool))]),
    );
    assert_eq!(shown, HOSTILE, "the exact action, as text");

    // Approve the tool gate.
    let sel = |id: &str, what: &str| format!("section#g-{id} {what}");
    let tid = id_of(&tool);
    b.get(&sel(&tid, "textarea[name=note]")).type_text("checked with ana: the release branch");
    b.click_and_wait(&sel(&tid, "button[value=approve]"));
    assert!(b.url().ends_with(&format!("/gates?decided={tid}")), "{}\n{}", b.url(), b.source());
    assert!(b.get("p.notice").text().contains("is approved by rev@example.test"), "{}", b.source());
    let v = gate(base, &p.rev.token, &tid);
    assert_eq!(
        (v["state"].as_str(), v["decision"]["by_email"].as_str()),
        (Some("approved"), Some(REV)),
        "{v}"
    );
    assert_eq!(v["decision"]["note"], "checked with ana: the release branch");
    // `AIRLOCK_SCREENSHOTS=docs/img` refreshes the picture docs/console.md shows: the
    // confirmation, and the high gate with its password field.
    if let Some(dir) = std::env::var_os("AIRLOCK_SCREENSHOTS") {
        b.screenshot(&std::path::Path::new(&dir).join("console-gates.png"));
    }

    // The high gate: the password again.
    let hid = id_of(&high);
    b.get(&sel(&hid, "textarea[name=note]")).type_text("finance ticket 88");
    b.get(&sel(&hid, "input[name=password]")).type_text(PW);
    b.click_and_wait(&sel(&hid, "button[value=approve]"));
    assert!(b.url().ends_with(&format!("/gates?decided={hid}")), "{}\n{}", b.url(), b.source());
    let v = gate(base, &p.rev.token, &hid);
    assert_eq!(
        (v["state"].as_str(), v["decision"]["step_up"].as_bool()),
        (Some("approved"), Some(true)),
        "{v}"
    );
    assert_eq!(v["decision"]["by_email"], REV);

    // Deny bo's.
    let bid = id_of(&bo);
    b.get(&sel(&bid, "textarea[name=note]")).type_text("not during the freeze");
    b.click_and_wait(&sel(&bid, "button[value=deny]"));
    let v = gate(base, &p.rev.token, &bid);
    assert_eq!(
        (v["state"].as_str(), v["decision"]["by_email"].as_str()),
        (Some("denied"), Some(REV)),
        "{v}"
    );
    assert!(b.find("section.gate").is_none(), "nothing pending is left:\n{}", b.source());
    let decided = b.eval(
        "return Array.prototype.map.call(document.querySelectorAll('table.decided tbody tr'), \
           function(r) { return r.cells[1].innerText + ' ' + r.cells[4].innerText; })",
        json!([]),
    );
    assert_eq!(
        decided,
        json!([
            format!("denied {REV}"),
            format!("approved {REV} (step-up)"),
            format!("approved {REV}")
        ]),
        "{}",
        b.source()
    );
    assert_eq!(b.eval("return typeof window.__xss", json!([])), "undefined");
}

#[test]
fn console_gates_decided_in_a_real_browser_embedded() {
    if !browser::available() {
        return;
    }
    let world = World::new();
    decide_in_browser(&world, &StoreSel::Embedded(world.tmp.path().join("store")));
}

#[test]
fn console_gates_decided_in_a_real_browser_postgres() {
    if !browser::available() {
        return;
    }
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    decide_in_browser(&world, &StoreSel::Pg(db.runtime_url.clone()));
}

/// The whole path in a real browser: a developer's sandboxed curl holds a CONNECT to a gated
/// host; its supervisor relays it to the review server; a reviewer signs in to the console,
/// finds it on `/gates` and approves it there; only then does the upstream see a connection.
#[cfg(feature = "test-hooks")]
#[test]
fn console_gates_a_held_connect_approved_in_a_real_browser() {
    use std::sync::atomic::Ordering;
    if !have("curl") || !browser::available() {
        return;
    }
    let g = crate::sandbox_gate_server::relayed("console", "127.0.0.14", "90s", "");
    let port = g.port;
    let script = format!("curl -sS -m 120 -p http://gated.test:{port}/console; echo \"held:$?\"\n");
    let run = std::thread::scope(|s| {
        let exec = s.spawn(|| g.exec(&script));
        let gate = g.next_gate(&[]);
        let id = gate["id"].as_str().unwrap().to_owned();
        let b = browser::Browser::start();
        let base = g.server.base.as_str();
        b.goto(&format!("{base}/login"));
        b.get("input[name=email]").type_text("rev@example.test");
        b.get("input[name=password]").type_text(crate::sandbox_gate_server::PW);
        b.click_and_wait("button[type=submit]");
        b.goto(&format!("{base}/gates"));
        let sel = |what: &str| format!("section#g-{id} {what}");
        let shown = b.get(&sel("")).text();
        assert!(shown.contains(&format!("CONNECT gated.test:{port}")), "{shown}");
        assert!(shown.contains("dev@example.test"), "{shown}");
        assert_eq!(g.hits.load(Ordering::SeqCst), 0, "dialed before the decision");
        b.get(&sel("textarea[name=note]")).type_text("approved from the console");
        b.click_and_wait(&sel("button[value=approve]"));
        assert!(b.url().ends_with(&format!("/gates?decided={id}")), "{}", b.source());
        exec.join().unwrap()
    });
    let out = run.expect_code(0).stdout();
    assert!(out.contains("held:0"), "{out}");
    assert_eq!(g.hits.load(Ordering::SeqCst), 1, "dialed once, after the approval");
    let lines = g.dev.audit_lines("console");
    let approved = lines
        .iter()
        .find(|l| l["method"] == "GATE" && l["gate"]["step"] == "approved")
        .unwrap_or_else(|| panic!("{lines:#?}"));
    assert_eq!(approved["gate"]["by"], "rev@example.test");
    assert_eq!(approved["gate"]["note"], "approved from the console");
}
