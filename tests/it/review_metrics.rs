//! `GET /metrics` on the review listener (issue 13, "Operability"), through the real
//! `airlockd review` on both stores: after some traffic the exposition (parsed here as
//! Prometheus text format 0.0.4) counts ingest requests, items, rejections by code and flags
//! by rule, reports connections and slot use, and holds no user data; it is readable with an
//! admin's token or from loopback without one, never with a member's token.

use crate::review_support::*;
use crate::support::World;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};

/// One parsed exposition: sample values by series (`name{k="v",…}` with labels in the order
/// written), and each family's declared type.
struct Exposition {
    samples: BTreeMap<String, f64>,
    types: HashMap<String, String>,
}

impl Exposition {
    fn get(&self, series: &str) -> f64 {
        *self.samples.get(series).unwrap_or_else(|| {
            panic!("no series {series}; have {:?}", self.samples.keys().collect::<Vec<_>>())
        })
    }
}

fn valid_name(n: &str) -> bool {
    let mut chars = n.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Parses the text format strictly enough to catch what a Prometheus scraper would refuse:
/// names, quoted and escaped label values, numeric values, one `# TYPE` per family before its
/// samples, histograms cumulative up to `+Inf` = `_count`.
fn parse(text: &str) -> Exposition {
    assert!(text.ends_with('\n'), "the exposition ends with a line feed");
    let mut samples = BTreeMap::new();
    let mut types: HashMap<String, String> = HashMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let (kw, name) = (parts.next().unwrap(), parts.next().unwrap_or(""));
            assert!(valid_name(name), "bad family name in {line:?}");
            if kw == "TYPE" {
                let t = parts.next().unwrap_or("");
                assert!(
                    ["counter", "gauge", "histogram", "summary", "untyped"].contains(&t),
                    "bad type in {line:?}"
                );
                assert!(types.insert(name.into(), t.into()).is_none(), "TYPE twice: {line}");
                assert!(
                    !samples.keys().any(|k: &String| k.starts_with(name)),
                    "TYPE after samples of {name}"
                );
            } else {
                assert_eq!(kw, "HELP", "unknown comment {line:?}");
            }
            continue;
        }
        assert!(!line.is_empty() && !line.starts_with('#'), "stray line {line:?}");
        let name_end = line.find(['{', ' ']).unwrap_or_else(|| panic!("no value: {line:?}"));
        let name = &line[..name_end];
        assert!(valid_name(name), "bad metric name in {line:?}");
        let mut rest = &line[name_end..];
        let mut series = name.to_string();
        if let Some(after) = rest.strip_prefix('{') {
            // k="v" pairs, values with \\ \" \n escapes.
            let mut chars = after.char_indices().peekable();
            let mut labels = Vec::new();
            let end;
            loop {
                let start = chars.peek().map(|(i, _)| *i).unwrap();
                let mut key_end = start;
                for (i, c) in chars.by_ref() {
                    if c == '=' {
                        key_end = i;
                        break;
                    }
                }
                let key = &after[start..key_end];
                assert!(valid_name(key) && !key.starts_with("__"), "bad label in {line:?}");
                assert_eq!(chars.next().map(|(_, c)| c), Some('"'), "unquoted value: {line:?}");
                let mut value = String::new();
                loop {
                    match chars.next().map(|(_, c)| c) {
                        Some('\\') => match chars.next().map(|(_, c)| c) {
                            Some('\\') => value.push('\\'),
                            Some('"') => value.push('"'),
                            Some('n') => value.push('\n'),
                            other => panic!("bad escape {other:?} in {line:?}"),
                        },
                        Some('"') => break,
                        Some(c) => value.push(c),
                        None => panic!("unterminated value in {line:?}"),
                    }
                }
                labels.push(format!("{key}={value:?}"));
                match chars.next() {
                    Some((_, ',')) => continue,
                    Some((i, '}')) => {
                        end = i + 1;
                        break;
                    }
                    other => panic!("bad label list ({other:?}) in {line:?}"),
                }
            }
            series.push_str(&format!("{{{}}}", labels.join(",")));
            rest = &after[end..];
        }
        let value = rest.strip_prefix(' ').unwrap_or_else(|| panic!("no value in {line:?}"));
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad value in {line:?}")),
        };
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s).filter(|f| types.get(*f).is_some_and(|t| t == "histogram"))
            })
            .unwrap_or(name);
        let t = types.get(family).unwrap_or_else(|| panic!("sample before its TYPE: {line}"));
        if t == "counter" || family != name {
            assert!(value >= 0.0, "negative counter {line}");
        }
        assert!(samples.insert(series, value).is_none(), "series twice: {line}");
    }
    // Histograms: cumulative buckets ending at +Inf = count.
    for (family, t) in &types {
        if t != "histogram" {
            continue;
        }
        let mut buckets: Vec<(f64, f64)> = samples
            .iter()
            .filter_map(|(k, v)| {
                let le = k.strip_prefix(&format!("{family}_bucket{{le=\""))?.strip_suffix("\"}")?;
                let le = if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap() };
                Some((le, *v))
            })
            .collect();
        buckets.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
        assert!(buckets.windows(2).all(|w| w[0].1 <= w[1].1), "{family} not cumulative");
        assert_eq!(buckets.last().map(|b| b.0), Some(f64::INFINITY), "{family} lacks +Inf");
        let count = samples[&format!("{family}_count")];
        assert_eq!(buckets.last().unwrap().1, count, "{family}: +Inf bucket != count");
        assert!(samples.contains_key(&format!("{family}_sum")));
    }
    Exposition { samples, types }
}

const SESSION: &str = "metrics-private-session-name";

fn secret_line(id: &str) -> Value {
    json!({
        "id": id, "source": "claude", "type": "user", "ts": "2026-03-04T09:12:05.118Z",
        "session": SESSION,
        "payload": {"type": "user", "uuid": id, "sessionId": SESSION,
                    "timestamp": "2026-03-04T09:12:05.118Z",
                    "message": {"role": "user",
                                "content": "push with ghp_a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8 please"}}
    })
}

fn scrape(base: &str, extra: &[&str]) -> Http {
    let url = format!("{base}/metrics");
    let mut args: Vec<&str> = extra.to_vec();
    args.push(&url);
    curl(&args)
}

fn metrics_after_traffic(world: &World, store: StoreSel) {
    let admin = user_with_token(world, &store, "metrics-admin@example.test", "admin");
    let member = user_with_token(world, &store, "metrics-member@example.test", "member");
    let server = Server::start(world, &store, &[]);
    let mut foreign = egress("m-foreign-1", "private-host.example.test", true);
    foreign["user_id"] = json!("someone-else");
    let items = vec![
        secret_line("m-secret-line-1"),
        egress("m-egress-1", "private-host.example.test", true),
        foreign,
    ];
    let body = write_file(world.tmp.path(), "m.ndjson", &ndjson(&items));
    for _ in 0..2 {
        let r = post_events(&server.base, &member, &body, "application/x-ndjson", &[]);
        assert_eq!(r.status, 207, "{}", r.body);
    }
    let bad = get(&server.base, "alk_not-a-real-token", "/api/v1/me", &[]);
    assert_eq!(bad.status, 401);
    let flags = get(&server.base, &admin, "/api/v1/flags", &[]).json();
    let rule = flags["flags"][0]["rule_id"].as_str().expect("the secret raised a flag").to_string();
    let me = get(&server.base, &member, "/api/v1/me", &[]).json();

    let r = scrape(&server.base, &[]);
    assert_eq!(r.status, 200, "loopback without a token: {r:?}");
    let ct = r.headers.to_ascii_lowercase();
    assert!(ct.contains("content-type: text/plain; version=0.0.4"), "{}", r.headers);
    let m = parse(&r.body);
    assert_eq!(m.get("airlock_review_ingest_requests_total{code=\"207\"}"), 2.0);
    assert_eq!(m.get("airlock_review_ingest_items_total{status=\"created\"}"), 2.0);
    assert_eq!(m.get("airlock_review_ingest_items_total{status=\"duplicate\"}"), 2.0);
    assert_eq!(m.get("airlock_review_ingest_items_total{status=\"rejected\"}"), 2.0);
    assert_eq!(m.get("airlock_review_rejections_total{level=\"item\",code=\"403\"}"), 2.0);
    assert_eq!(m.get("airlock_review_rejections_total{level=\"request\",code=\"401\"}"), 1.0);
    assert!(m.get(&format!("airlock_review_flags_raised_total{{rule={rule:?}}}")) >= 1.0);
    assert_eq!(m.get("airlock_review_ingest_duration_seconds_count"), 2.0);
    assert_eq!(m.types["airlock_review_ingest_duration_seconds"], "histogram");
    assert_eq!(m.get("airlock_review_store_errors_total{kind=\"other\"}"), 0.0);
    assert_eq!(m.get("airlock_review_store_errors_total{kind=\"unavailable\"}"), 0.0);
    assert_eq!(m.get("airlock_review_rate_limited_total{limit=\"token\"}"), 0.0);
    assert!(m.get("airlock_review_connections_open") >= 1.0, "this scrape's connection");
    assert_eq!(m.get("airlock_review_connections_limit"), 1024.0);
    assert!(m.get("airlock_review_connections_accepted_total") >= 6.0);
    assert_eq!(m.get("airlock_review_slots_in_use{kind=\"ingest\"}"), 0.0);
    assert_eq!(m.get("airlock_review_slots_limit{kind=\"ingest\",scope=\"global\"}"), 8.0);
    assert_eq!(m.get("airlock_review_slots_limit{kind=\"ingest\",scope=\"per_user\"}"), 2.0);
    assert!(m.samples.contains_key("airlock_review_rate_limited_total{limit=\"ingest_per_user\"}"));

    // No user data: no email, user id, token, session, event id, host or store path.
    let dir = match &store {
        StoreSel::Embedded(d) => d.display().to_string(),
        StoreSel::Pg(url) => url.clone(),
    };
    for private in [
        "metrics-admin@example.test",
        "metrics-member@example.test",
        "example.test",
        me["id"].as_str().unwrap(),
        "someone-else",
        &admin,
        &member,
        SESSION,
        "m-secret-line-1",
        "m-egress-1",
        "ghp_",
        &dir,
    ] {
        assert!(!r.body.contains(private), "the exposition holds {private:?}:\n{}", r.body);
    }
}

#[test]
fn metrics_count_traffic_and_hold_no_user_data_embedded() {
    let world = World::new();
    metrics_after_traffic(&world, StoreSel::Embedded(world.tmp.path().join("d")));
}

#[test]
fn metrics_count_traffic_and_hold_no_user_data_postgres() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    metrics_after_traffic(&world, StoreSel::Pg(db.runtime_url.clone()));
}

/// An admin's token or a loopback peer without a token reads `/metrics`; a member's or
/// reviewer's token is 403 even from loopback; a bad token is 401.
#[test]
fn metrics_are_read_by_admins_or_from_loopback_only() {
    let world = World::new();
    let store = StoreSel::Embedded(world.tmp.path().join("d"));
    let admin = user_with_token(&world, &store, "admin@example.test", "admin");
    let member = user_with_token(&world, &store, "ana@example.test", "member");
    let reviewer = user_with_token(&world, &store, "rev@example.test", "reviewer");
    let server = Server::start(&world, &store, &[]);
    let bearer = |t: &str| format!("Authorization: Bearer {t}");
    assert_eq!(scrape(&server.base, &[]).status, 200);
    assert_eq!(scrape(&server.base, &["-H", &bearer(&admin)]).status, 200);
    assert_eq!(scrape(&server.base, &["-H", &bearer(&member)]).status, 403);
    assert_eq!(scrape(&server.base, &["-H", &bearer(&reviewer)]).status, 403);
    assert_eq!(scrape(&server.base, &["-H", &bearer("alk_wrong")]).status, 401);
    assert_eq!(scrape(&server.base, &["-X", "POST"]).status, 405);
}

/// From a peer that is not loopback (simulated by a test hook), no token is 401 and a
/// member's token 403; an admin's token still reads the metrics.
#[cfg(feature = "test-hooks")]
#[test]
fn metrics_from_a_remote_peer_need_an_admin_token() {
    let world = World::new();
    let store = StoreSel::Embedded(world.tmp.path().join("d"));
    let admin = user_with_token(&world, &store, "admin@example.test", "admin");
    let member = user_with_token(&world, &store, "ana@example.test", "member");
    let server = Server::start_with_env(
        &world,
        &store,
        &[],
        "http",
        &[("AIRLOCK_TEST_REVIEW_PEERS_REMOTE", "1")],
    );
    let bearer = |t: &str| format!("Authorization: Bearer {t}");
    let anon = scrape(&server.base, &[]);
    assert_eq!(anon.status, 401, "{anon:?}");
    assert!(anon.headers.to_ascii_lowercase().contains("www-authenticate: bearer"));
    assert_eq!(scrape(&server.base, &["-H", &bearer(&member)]).status, 403);
    let r = scrape(&server.base, &["-H", &bearer(&admin)]);
    assert_eq!(r.status, 200);
    parse(&r.body);
}

/// A store that goes away is counted as a store error (the answer is a 503).
#[test]
fn metrics_count_store_errors() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    let store = StoreSel::Pg(db.runtime_url.clone());
    let tok = user_with_token(&world, &store, "ana@example.test", "member");
    let server = Server::start(&world, &store, &[]);
    assert_eq!(get(&server.base, &tok, "/api/v1/me", &[]).status, 200);
    let out = std::process::Command::new("psql")
        .args([PG_ADMIN, "-qAt", "-c", &format!("DROP DATABASE {} WITH (FORCE)", db.name)])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let f =
        write_file(world.tmp.path(), "x.ndjson", &ndjson(&[egress("x1", "example.test", true)]));
    let r = post_events(&server.base, &tok, &f, "application/x-ndjson", &[]);
    assert_eq!(r.status, 503, "{r:?}");
    let m = parse(&scrape(&server.base, &[]).body);
    let errors = m.get("airlock_review_store_errors_total{kind=\"unavailable\"}")
        + m.get("airlock_review_store_errors_total{kind=\"other\"}");
    assert!(errors >= 1.0, "store errors counted: {errors}");
    assert_eq!(m.get("airlock_review_ingest_requests_total{code=\"503\"}"), 1.0);
    assert_eq!(m.get("airlock_review_rejections_total{level=\"request\",code=\"503\"}"), 1.0);
}

/// Ingests whose client goes away before the answer (a `kill -9`ed `airlock publish`) are
/// counted in `/metrics` exactly as far as they were stored. (Regression: hyper drops the
/// handler of a closed connection; one dropped after its commit, a blocking task that runs on,
/// stored its items without counting them, so `created` stayed below what the store held.)
#[test]
fn metrics_count_ingests_whose_client_went_away() {
    use std::io::Write;
    use std::time::Duration;
    let world = World::new();
    let store = StoreSel::Embedded(world.tmp.path().join("d"));
    let tok = user_with_token(&world, &store, "ana@example.test", "member");
    let server = Server::start(&world, &store, &[]);
    // Clients that hang up at various points of their request's life: before the server read
    // the body, while it stores it, after.
    for (k, wait_ms) in [0u64, 20, 50, 100, 200, 400, 800, 1600].into_iter().enumerate() {
        let items: Vec<Value> =
            (0..1000).map(|i| egress(&format!("gone-{k}-{i}"), "example.test", true)).collect();
        let body = ndjson(&items);
        let mut s = std::net::TcpStream::connect(("127.0.0.1", server.port)).unwrap();
        write!(
            s,
            "POST /api/v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {tok}\r\n\
             Content-Type: application/x-ndjson\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .unwrap();
        s.write_all(&body).unwrap();
        std::thread::sleep(Duration::from_millis(wait_ms));
        drop(s);
    }
    // Until the store stops growing (every request done, however it ended).
    let mut last = usize::MAX;
    loop {
        std::thread::sleep(Duration::from_millis(1500));
        let n = all_events(&server.base, &tok, "").len();
        if n == last {
            break;
        }
        last = n;
    }
    let created = parse(&scrape(&server.base, &[]).body)
        .get("airlock_review_ingest_items_total{status=\"created\"}");
    eprintln!("stored {last}, counted {created}");
    assert_eq!(created, last as f64, "items stored but not counted in /metrics");
}
