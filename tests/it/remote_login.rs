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
use crate::support::{Run, World, airlock_stdin, bin};

fn gzip(data: &[u8]) -> bytes::Bytes {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap().into()
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// `airlock ARGS` with `stdin` piped in (the token for `--token-stdin`).
fn login(world: &World, server: &str, token: &str, extra: &[&str]) -> Run {
    let mut args = vec!["login", "--server", server, "--token-stdin"];
    args.extend_from_slice(extra);
    airlock_stdin(world, world.tmp.path(), &args, &format!("{token}\n"))
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

/// Logs in with a good token and checks what is on disk and what `whoami` says.
fn good_login(world: &World, token: &str, base: &str, email: &str, role: &str) {
    let run = login(world, base, token, &[]).expect_code(0);
    assert!(run.stdout().contains(&format!("logged in to {base} as {email}")), "{}", run.stdout());
    assert!(!run.stdout().contains(token) && !run.stderr().contains(token));
    let dir = world.home.join(".airlock");
    let token_file = dir.join("token");
    assert_eq!(std::fs::read_to_string(&token_file).unwrap(), format!("{token}\n"));
    assert_eq!(mode(&token_file), 0o600);
    assert_eq!(mode(&dir.join("identity.toml")), 0o600);
    let identity: toml::Value =
        toml::from_str(&std::fs::read_to_string(dir.join("identity.toml")).unwrap()).unwrap();
    assert_eq!(identity["server"].as_str(), Some(base));
    assert_eq!(identity["email"].as_str(), Some(email));
    assert_eq!(identity["role"].as_str(), Some(role));
    assert!(!std::fs::read_to_string(dir.join("identity.toml")).unwrap().contains(token));

    let who = world.airlock(world.tmp.path()).args(["whoami"]).run().expect_code(0).stdout();
    let user_id = identity["user_id"].as_str().unwrap();
    assert!(who.contains(&format!("server: {base}\n")), "{who}");
    assert!(who.contains(&format!("email: {email}\n")), "{who}");
    assert!(who.contains(&format!("user_id: {user_id}\n")), "{who}");
    assert!(who.contains(&format!("role: {role}\n")), "{who}");
    assert!(who.contains("token: works"), "{who}");
}

fn revoke_all(world: &World, store: &StoreSel, email: &str) {
    world
        .airlockd(world.tmp.path())
        .args(["admin", "token", "revoke", "--user", email])
        .args(store.admin_args())
        .run()
        .expect_code(0);
}

#[test]
fn good_bad_and_revoked_tokens_embedded() {
    let world = World::new();
    let store = StoreSel::Embedded(world.tmp.path().join("store"));
    let token = user_with_token(&world, &store, "dev@example.test", "member");
    let server = Server::start(&world, &store, &[]);
    let base = server.base.clone();
    let dir = world.home.join(".airlock");

    // A bad token: a clear 401 error, nothing written.
    let run = login(&world, &base, "alk_not_a_real_token", &[]).expect_code(1);
    assert!(run.stderr().contains("refused the token"), "{}", run.stderr());
    assert!(run.stderr().contains("nothing was saved"), "{}", run.stderr());
    assert!(!run.stderr().contains("alk_not_a_real_token"), "{}", run.stderr());
    assert!(!dir.join("token").exists() && !dir.join("identity.toml").exists());

    // An empty token on stdin, and no terminal without --token-stdin.
    let run = airlock_stdin(
        &world,
        world.tmp.path(),
        &["login", "--server", &base, "--token-stdin"],
        "\n",
    );
    let run = run.expect_code(1);
    assert!(run.stderr().contains("is empty"), "{}", run.stderr());
    let run = airlock_stdin(&world, world.tmp.path(), &["login", "--server", &base], "alk_x\n")
        .expect_code(1);
    assert!(run.stderr().contains("pass --token-stdin"), "{}", run.stderr());
    assert!(!dir.join("token").exists() && !dir.join("identity.toml").exists());

    // A good token.
    good_login(&world, &token, &base, "dev@example.test", "member");
    let offline =
        world.airlock(world.tmp.path()).args(["whoami", "--offline"]).run().expect_code(0);
    assert!(offline.stdout().contains("token: not checked (--offline)"), "{}", offline.stdout());

    // A bad token later does not replace the good login.
    login(&world, &base, "alk_wrong", &[]).expect_code(1);
    world.airlock(world.tmp.path()).args(["whoami"]).run().expect_code(0);

    // Revoked: whoami says so, names the fix and exits non-zero; --offline still shows it.
    revoke_all(&world, &store, "dev@example.test");
    let run = world.airlock(world.tmp.path()).args(["whoami"]).run().expect_code(1);
    assert!(run.stdout().contains("token: no longer works"), "{}", run.stdout());
    assert!(run.stderr().contains(&format!("airlock login --server {base}")), "{}", run.stderr());
    world.airlock(world.tmp.path()).args(["whoami", "--offline"]).run().expect_code(0);

    // Logout removes the token and the server identity.
    let run = world.airlock(world.tmp.path()).args(["logout"]).run().expect_code(0);
    assert!(run.stdout().contains("token"), "{}", run.stdout());
    assert!(!dir.join("token").exists() && !dir.join("identity.toml").exists());
    world.airlock(world.tmp.path()).args(["whoami"]).run().expect_code(1);
}

#[test]
fn good_and_revoked_tokens_postgres() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    let store = StoreSel::Pg(db.runtime_url.clone());
    let server = Server::start(&world, &store, &[]);
    world
        .airlockd(world.tmp.path())
        .args(["admin", "user", "add", "--email", "pg@example.test", "--role", "reviewer"])
        .args(store.admin_args())
        .run()
        .expect_code(0);
    let token = crate::review_support::token_for(&world, &store, "pg@example.test");
    let run = login(&world, &server.base, &token, &[]).expect_code(0);
    assert!(run.stdout().contains("role reviewer"), "{}", run.stdout());
    world.airlock(world.tmp.path()).args(["whoami"]).run().expect_code(0);
    revoke_all(&world, &store, "pg@example.test");
    let run = world.airlock(world.tmp.path()).args(["whoami"]).run().expect_code(1);
    assert!(run.stdout().contains("token: no longer works"), "{}", run.stdout());
}

#[test]
fn self_signed_ca_needs_cacert_which_is_stored_and_used() {
    let world = World::new();
    let store = StoreSel::Embedded(world.tmp.path().join("store"));
    let (cert, key) = crate::review_support::init_tls(&world);
    let (c, k) = (cert.display().to_string(), key.display().to_string());
    let token = user_with_token(&world, &store, "tls@example.test", "member");
    let server =
        Server::start_scheme(&world, &store, &["--tls-cert", &c, "--tls-key", &k], "https");
    let dir = world.home.join(".airlock");

    // Without --cacert: a TLS trust error saying what to do; nothing written.
    let run = login(&world, &server.base, &token, &[]).expect_code(1);
    assert!(run.stderr().contains("TLS"), "{}", run.stderr());
    assert!(run.stderr().contains("--cacert"), "{}", run.stderr());
    assert!(!dir.join("token").exists() && !dir.join("identity.toml").exists());

    // A --cacert file without a certificate is named.
    let junk = world.write(world.tmp.path().join("junk.pem"), "hello\n");
    let run = login(&world, &server.base, &token, &["--cacert", &junk.display().to_string()]);
    let run = run.expect_code(1);
    assert!(run.stderr().contains(&junk.display().to_string()), "{}", run.stderr());
    assert!(run.stderr().contains("no certificate"), "{}", run.stderr());

    // With it: works, the CA is copied (0600) and every later call uses it.
    let run = login(&world, &server.base, &token, &["--cacert", &c]).expect_code(0);
    assert!(run.stdout().contains("logged in to https://127.0.0.1:"), "{}", run.stdout());
    let stored = dir.join("server-ca.pem");
    assert_eq!(std::fs::read(&stored).unwrap(), std::fs::read(&cert).unwrap());
    assert_eq!(mode(&stored), 0o600);
    std::fs::remove_file(&cert).unwrap();
    let who = world.airlock(world.tmp.path()).args(["whoami"]).run().expect_code(0).stdout();
    assert!(who.contains("token: works"), "{who}");
    // Without the stored CA the platform roots do not trust the server.
    std::fs::remove_file(&stored).unwrap();
    let run = world.airlock(world.tmp.path()).args(["whoami"]).run().expect_code(1);
    assert!(run.stderr().contains("--cacert"), "{}", run.stderr());

    world.airlock(world.tmp.path()).args(["logout"]).run().expect_code(0);
    assert!(!dir.join("token").exists() && !stored.exists());
}

#[test]
fn open_token_files_are_refused_and_email_login_replaces_a_server_login() {
    let world = World::new();
    let store = StoreSel::Embedded(world.tmp.path().join("store"));
    let token = user_with_token(&world, &store, "dev@example.test", "member");
    let server = Server::start(&world, &store, &[]);
    good_login(&world, &token, &server.base, "dev@example.test", "member");
    let token_file = world.home.join(".airlock/token");
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o640)).unwrap();
    let run = world.airlock(world.tmp.path()).args(["whoami"]).run().expect_code(1);
    let hint = format!("chmod 600 {}", token_file.display());
    assert!(run.stderr().contains(&hint), "{}", run.stderr());
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    world.airlock(world.tmp.path()).args(["whoami"]).run().expect_code(0);

    // A local identity replaces the server login whole: the token goes too.
    let run = world
        .airlock(world.tmp.path())
        .args(["login", "--email", "local@example.test"])
        .run()
        .expect_code(0);
    assert!(run.stdout().contains("logged out of the review server"), "{}", run.stdout());
    assert!(!token_file.exists());
    let who = world.airlock(world.tmp.path()).args(["whoami"]).run().expect_code(0).stdout();
    assert!(who.starts_with("email: local@example.test\nuser_id: u_"), "{who}");
    assert!(who.contains("server: none"), "{who}");

    // Usage: --token-stdin and --cacert need --server; --email and --server exclude each other.
    world.airlock(world.tmp.path()).args(["login", "--token-stdin"]).run().expect_code(2);
    world
        .airlock(world.tmp.path())
        .args(["login", "--email", "a@b.test", "--server", &server.base])
        .run()
        .expect_code(2);
    // A plain-http URL to another host is refused before any token is read.
    let run = login(&world, "http://192.0.2.1:8443", "alk_x", &[]).expect_code(1);
    assert!(run.stderr().contains("only to a loopback address"), "{}", run.stderr());
}

/// After `login --server`, a real session's audit lines and session records carry the
/// server's user id (they take `user_id` from the identity file).
#[test]
fn sessions_after_login_carry_the_servers_user_id() {
    use crate::harness::{Harness, Options};
    if !crate::support::have("curl") {
        return;
    }
    let world = World::new();
    world.write(world.home.join(".airlock/config.toml"), "[network]\nallow = [\"example.test\"]\n");
    let store = StoreSel::Embedded(world.tmp.path().join("store"));
    let token = user_with_token(&world, &store, "dev@example.test", "member");
    let server = Server::start(&world, &store, &[]);
    good_login(&world, &token, &server.base, "dev@example.test", "member");
    let identity: toml::Value = toml::from_str(
        &std::fs::read_to_string(world.home.join(".airlock/identity.toml")).unwrap(),
    )
    .unwrap();
    let user_id = identity["user_id"].as_str().unwrap().to_owned();
    assert!(!user_id.starts_with("u_"), "the server's id, not a local one: {user_id}");

    let repo = world.repo("app");
    let h = Harness::start(&world, Options::default());
    let run = world
        .airlock(&repo)
        .env("AIRLOCK_SOCKET", h.socket())
        .args([
            "exec",
            "--",
            "sh",
            "-c",
            "curl -s -o /dev/null -m 5 http://denied.test/; echo done",
        ])
        .run();
    assert_eq!(run.code(), 0, "{}\n{}\n{}", run.stdout(), run.stderr(), h.log());
    let dir = world.home.join(".airlock/logs/app");
    let audit = crate::support::jsonl_lines(&dir, "audit-");
    assert!(!audit.is_empty(), "no audit lines in {}", dir.display());
    assert!(audit.iter().all(|l| l["user_id"] == user_id.as_str()), "{audit:#?}");
    let records = crate::support::jsonl_lines(&dir, "sessions-");
    assert_eq!(records.len(), 2, "{records:#?}");
    assert!(records.iter().all(|r| r["user_id"] == user_id.as_str()), "{records:#?}");
}

/// `airlock login --server URL` on a terminal, with the master side of a pty.
fn login_on_a_terminal(world: &World, base: &str, typed: &[u8]) -> (Run, String, bool) {
    use nix::sys::termios::{LocalFlags, tcgetattr};
    let pty = nix::pty::openpty(None, None).unwrap();
    let slave = std::fs::File::from(pty.slave);
    let mut cmd = Command::new(bin("airlock"));
    cmd.current_dir(world.tmp.path())
        .env_clear()
        .env("HOME", &world.home)
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .args(["login", "--server", base])
        .stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::piped())
        .stderr(Stdio::from(slave.try_clone().unwrap()));
    let child = cmd.spawn().unwrap();
    drop(cmd);
    let master = std::fs::File::from(pty.master);
    let mut terminal = crate::support::PtyOutput::read(&master);
    terminal.wait_for(b"review server token: ");
    (&master).write_all(typed).unwrap();
    let output = child.wait_with_output().unwrap();
    // Echo is back on once login has exited, whichever way it ended.
    let echo = tcgetattr(&slave).unwrap().local_flags.contains(LocalFlags::ECHO);
    drop(slave);
    let seen = String::from_utf8_lossy(&terminal.until_closed()).into_owned();
    (Run { output }, seen, echo)
}

#[test]
fn the_terminal_prompt_does_not_echo_and_ctrl_c_restores_the_terminal() {
    let world = World::new();
    let store = StoreSel::Embedded(world.tmp.path().join("store"));
    let token = user_with_token(&world, &store, "tty@example.test", "member");
    let server = Server::start(&world, &store, &[]);

    // Ctrl-C at the prompt: cancelled, nothing written, echo restored.
    let (run, seen, echo) = login_on_a_terminal(&world, &server.base, b"alk_half\x03");
    assert_eq!(run.code(), 1, "{seen}");
    assert!(seen.contains("cancelled; nothing was saved"), "{seen:?}");
    assert!(!seen.contains("alk_half"), "typed text was echoed: {seen:?}");
    assert!(echo, "echo was left off after Ctrl-C");
    assert!(!world.home.join(".airlock/token").exists());

    // Typed (with a correction), then Enter: logged in, the token never echoed.
    let mut typed = b"x\x7f".to_vec();
    typed.extend_from_slice(token.as_bytes());
    typed.push(b'\r');
    let (run, seen, echo) = login_on_a_terminal(&world, &server.base, &typed);
    assert_eq!(run.code(), 0, "{seen}\n{}", run.stdout());
    assert!(run.stdout().contains("logged in to"), "{}", run.stdout());
    assert!(!seen.contains(&token) && !seen.contains(&token[..12]), "echoed: {seen:?}");
    assert!(echo, "echo was left off after the prompt");
    assert_eq!(
        std::fs::read_to_string(world.home.join(".airlock/token")).unwrap(),
        format!("{token}\n")
    );
}
