//! Regressions found by fuzzing the API contract (docs/openapi.yaml, `bash .ci/schemathesis`)
//! against the real `airlockd review` on both stores; each test is named after the bug.

use crate::review_support::*;
use crate::support::World;

/// Every method a path does not serve is a 405 naming the ones it does in `Allow` (RFC 9110
/// §15.5.6 requires the header); `/healthz` answered any method with 200 and no 405 had one.
fn a_405_names_the_allowed_methods(world: &World, store: &StoreSel) {
    let token = user_with_token(world, store, "admin@example.test", "admin");
    let server = Server::start(world, store, &[]);
    let auth = format!("Authorization: Bearer {token}");
    let cases = [
        ("DELETE", "/api/v1/events", "GET, POST"),
        ("PUT", "/api/v1/me", "GET"),
        ("POST", "/api/v1/flags", "GET"),
        ("GET", "/api/v1/flags/some-flag", "POST"),
        ("POST", "/api/v1/export", "GET"),
        ("POST", "/metrics", "GET"),
        ("TRACE", "/metrics", "GET"),
        ("POST", "/healthz", "GET"),
        ("DELETE", "/healthz", "GET"),
    ];
    for (method, path, allow) in cases {
        let url = format!("{}{path}", server.base);
        let r = curl(&["-X", method, "-H", &auth, &url]);
        assert_eq!(r.status, 405, "{method} {path}: {r:?}");
        let got: Vec<&str> = r
            .headers
            .lines()
            .filter_map(|l| l.split_once(':'))
            .filter(|(k, _)| k.eq_ignore_ascii_case("allow"))
            .map(|(_, v)| v.trim())
            .collect();
        assert_eq!(got, [allow], "{method} {path}: {}", r.headers);
        assert_eq!(r.json()["code"], 405, "{method} {path}");
    }
    // The methods served are unchanged.
    let r = curl(&[&format!("{}/healthz", server.base)]);
    assert_eq!((r.status, r.json()), (200, serde_json::json!({"ok": true})));
    assert_eq!(get(&server.base, &token, "/api/v1/me", &[]).status, 200);
}

#[test]
fn a_405_names_the_allowed_methods_embedded() {
    let world = World::new();
    a_405_names_the_allowed_methods(&world, &StoreSel::Embedded(world.tmp.path().join("d")));
}

#[test]
fn a_405_names_the_allowed_methods_postgres() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    a_405_names_the_allowed_methods(&world, &StoreSel::Pg(db.runtime_url.clone()));
}
