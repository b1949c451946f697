//! `airlock login --server`, `whoami`, `logout` and the review-plane client
//! (`airlock::remote`) against a real `airlockd review` on loopback: good, bad and revoked
//! tokens, a self-signed CA with and without `--cacert`, the token file's mode, both stores,
//! and audit lines of a real session carrying the server's `user_id` after login.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

use airlock::remote::{Client, RemoteError};
use zeroize::Zeroizing;

use crate::review_support::{PgDb, Server, StoreSel, ndjson, user_with_token};
use crate::support::{Run, World, bin};

fn gzip(data: &[u8]) -> bytes::Bytes {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap().into()
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// `airlock ARGS` with `stdin` piped in (the token for `--token-stdin`).
fn airlock_stdin(world: &World, args: &[&str], stdin: &str) -> Run {
    let mut cmd = Command::new(bin("airlock"));
    cmd.current_dir(world.tmp.path())
        .env_clear()
        .env("HOME", &world.home)
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    Run { output: child.wait_with_output().unwrap() }
}

fn login(world: &World, server: &str, token: &str, extra: &[&str]) -> Run {
    let mut args = vec!["login", "--server", server, "--token-stdin"];
    args.extend_from_slice(extra);
    airlock_stdin(world, &args, &format!("{token}\n"))
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

fn egress_item(id: &str) -> serde_json::Value {
    crate::review_support::egress(id, "api.example.test", true)
}

/// The library client other commands (publish) use: `me`, both ingest answers, 401, and
/// several posts in flight on one client.
#[test]
fn client_api_against_a_real_server() {
    let world = World::new();
    let store = StoreSel::Embedded(world.tmp.path().join("store"));
    let token = user_with_token(&world, &store, "dev@example.test", "member");
    let server = Server::start(&world, &store, &[]);
    let rt = rt();
    let client = Client::new(&server.base, Zeroizing::new(token.clone()), None).unwrap();
    assert_eq!(client.server(), server.base);
    assert!(!format!("{client:?}").contains(&token));

    let me = rt.block_on(client.me()).unwrap();
    assert_eq!(me.email, "dev@example.test");
    assert_eq!(me.role, "member");
    assert!(!me.id.is_empty());
    assert!(me.ingest_concurrency.is_some_and(|n| n >= 1), "{me:?}");

    let body = ndjson(&[egress_item("e-1"), egress_item("e-2")]);
    let reply = rt.block_on(client.post_events(gzip(&body))).unwrap();
    assert_eq!(reply.status, 200);
    assert!(reply.ingest_concurrency.is_some());
    let st: Vec<&str> = reply.results.iter().map(|r| r.status.as_str()).collect();
    assert_eq!(st, ["created", "created"]);
    assert_eq!(reply.results[1].index, 1);
    assert_eq!(reply.results[1].id.as_deref(), Some("e-2"));

    // A repeat, a changed payload under a stored id, and a bad item: a 207.
    let mut changed = egress_item("e-1");
    changed["payload"]["host"] = "other.example.test".into();
    let bad = serde_json::json!({"id": "x", "source": "egress"});
    let body = ndjson(&[egress_item("e-2"), changed, bad]);
    let reply = rt.block_on(client.post_events(gzip(&body))).unwrap();
    assert_eq!(reply.status, 207);
    let st: Vec<(&str, u16)> = reply.results.iter().map(|r| (r.status.as_str(), r.code)).collect();
    assert_eq!(st, [("duplicate", 200), ("conflict", 409), ("rejected", 400)]);
    assert!(reply.results[2].error.as_deref().is_some_and(|e| !e.is_empty()));

    // Several posts in flight on one (cloned) client, some on kept-alive connections.
    rt.block_on(async {
        let mut tasks = Vec::new();
        for i in 0..6 {
            let c = client.clone();
            let body = gzip(&ndjson(&[egress_item(&format!("p-{i}"))]));
            tasks.push(tokio::spawn(async move { c.post_events(body).await }));
        }
        for t in tasks {
            match t.await.unwrap() {
                Ok(r) => assert_eq!(r.results[0].status, "created"),
                // The per-user share may refuse one while others are in progress.
                Err(RemoteError::Retry { status: 429, after, .. }) => assert!(after.is_some()),
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(client.me().await.unwrap().email, "dev@example.test");
    });

    // A body the server refuses whole: the status and its error text.
    let e = rt.block_on(client.post_events(bytes::Bytes::from_static(b"not gzip"))).unwrap_err();
    match &e {
        RemoteError::Status { status: 400, message, .. } => {
            assert!(message.contains("gzip"), "{message}")
        }
        other => panic!("{other}"),
    }

    let wrong = Client::new(&server.base, Zeroizing::new("alk_wrong".into()), None).unwrap();
    let e = rt.block_on(wrong.me()).unwrap_err();
    assert!(matches!(e, RemoteError::Unauthorized { .. }), "{e}");
    let text = e.to_string();
    assert!(text.contains("airlock login --server"), "{text}");
    assert!(!text.contains("alk_wrong"), "{text}");
    let e = rt.block_on(wrong.post_events(gzip(b"{}\n"))).unwrap_err();
    assert!(matches!(e, RemoteError::Unauthorized { .. }), "{e}");
}
