//! Helpers for the review-plane tests: a throwaway PostgreSQL database and runtime role per
//! test, a running `airlockd review` server, and HTTP through real clients (curl, python3).
#![allow(dead_code)]

use crate::support::{World, bin, in_ci};
use std::io::Write;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const PG_ADMIN: &str = "postgres://postgres@127.0.0.1:5432/postgres";

fn rand_hex(n: usize) -> String {
    let mut b = vec![0u8; n];
    getrandom::fill(&mut b).unwrap();
    hex::encode(b)
}

fn psql(url: &str, sql: &str) -> Result<String, String> {
    let out = Command::new("psql")
        .args([url, "-v", "ON_ERROR_STOP=1", "-qAt", "-c", sql])
        .output()
        .map_err(|e| format!("psql: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// A fresh database `airlock_test_<random>` with a runtime role and an admin role, migrated;
/// dropped on drop.
pub struct PgDb {
    pub name: String,
    pub role: String,
    pub owner_url: String,
    pub runtime_url: String,
    /// The role `airlockd admin` connects as (users, roles, tokens; see [`admin_url_for`]).
    pub admin_role: String,
    pub admin_url: String,
}

/// The admin-role URL of a [`PgDb`] runtime URL (`airlock_rt_X` → `airlock_adm_X`); any other
/// URL (the owner's, a test's own) is returned as it is. `airlockd admin` needs it because
/// the runtime role cannot write users or tokens.
pub fn admin_url_for(url: &str) -> String {
    url.replacen("://airlock_rt_", "://airlock_adm_", 1)
}

impl PgDb {
    /// `None` (with a note) when PostgreSQL is unreachable outside CI; a panic in CI.
    pub fn create() -> Option<Self> {
        if let Err(e) = psql(PG_ADMIN, "SELECT 1") {
            assert!(!in_ci(), "PostgreSQL at 127.0.0.1:5432 is unreachable in CI: {e}");
            eprintln!("SKIP: PostgreSQL at 127.0.0.1:5432 unreachable: {e}");
            return None;
        }
        let suffix = rand_hex(6);
        let name = format!("airlock_test_{suffix}");
        let role = format!("airlock_rt_{suffix}");
        let admin_role = format!("airlock_adm_{suffix}");
        psql(PG_ADMIN, &format!("CREATE DATABASE {name}")).unwrap();
        psql(PG_ADMIN, &format!("CREATE ROLE {role} LOGIN")).unwrap();
        psql(PG_ADMIN, &format!("CREATE ROLE {admin_role} LOGIN")).unwrap();
        let db = Self {
            owner_url: format!("postgres://postgres@127.0.0.1:5432/{name}"),
            runtime_url: format!("postgres://{role}@127.0.0.1:5432/{name}"),
            admin_url: format!("postgres://{admin_role}@127.0.0.1:5432/{name}"),
            name,
            role,
            admin_role,
        };
        Some(db)
    }

    /// Runs `airlockd review migrate` as the owner, granting the runtime and admin roles.
    pub fn migrate(&self, world: &World) {
        world
            .airlockd(world.tmp.path())
            .args([
                "review",
                "migrate",
                "--database",
                &self.owner_url,
                "--runtime-role",
                &self.role,
                "--admin-role",
                &self.admin_role,
            ])
            .run()
            .expect_code(0);
    }

    pub fn admin_sql(&self, sql: &str) -> Result<String, String> {
        psql(&self.admin_url, sql)
    }

    pub fn owner_sql(&self, sql: &str) -> Result<String, String> {
        psql(&self.owner_url, sql)
    }

    pub fn runtime_sql(&self, sql: &str) -> Result<String, String> {
        psql(&self.runtime_url, sql)
    }
}

impl Drop for PgDb {
    fn drop(&mut self) {
        let _ = psql(PG_ADMIN, &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name));
        let _ = psql(PG_ADMIN, &format!("DROP ROLE IF EXISTS {}", self.role));
        let _ = psql(PG_ADMIN, &format!("DROP ROLE IF EXISTS {}", self.admin_role));
    }
}

/// Which store a server or admin command uses.
#[derive(Clone)]
pub enum StoreSel {
    Embedded(PathBuf),
    Pg(String),
}

impl StoreSel {
    pub fn args(&self) -> Vec<String> {
        match self {
            StoreSel::Embedded(d) => vec!["--data-dir".into(), d.display().to_string()],
            StoreSel::Pg(url) => vec!["--database".into(), url.clone()],
        }
    }

    /// [`Self::args`] for `airlockd admin`: a [`PgDb`] runtime URL becomes its admin URL.
    pub fn admin_args(&self) -> Vec<String> {
        match self {
            StoreSel::Pg(url) => vec!["--database".into(), admin_url_for(url)],
            other => other.args(),
        }
    }
}

/// The admin `user_with_token` makes with `airlockd review init` when it must create an
/// embedded store for a user who is not an admin.
pub const INIT_ADMIN: &str = "init-admin@example.test";

/// Runs `airlockd review init` on `dir` with `admin` and returns the printed token.
pub fn init_store(world: &World, dir: &Path, admin: &str) -> String {
    let run = world
        .airlockd(world.tmp.path())
        .args(["review", "init", "--admin", admin, "--data-dir"])
        .args([dir])
        .run()
        .expect_code(0);
    let t = run.stdout().trim().to_string();
    assert!(t.starts_with("alk_"), "token: {t:?}");
    assert!(!run.stderr().contains(&t), "the secret must not appear on stderr");
    t
}

/// Adds a user and returns a fresh token for them. An embedded store that does not exist yet
/// is made with `airlockd review init` (the only command that creates one): with this user as
/// its admin when `role` is admin, else with [`INIT_ADMIN`].
pub fn user_with_token(world: &World, store: &StoreSel, email: &str, role: &str) -> String {
    if let StoreSel::Embedded(dir) = store
        && !dir.join("review.db").exists()
    {
        if role == "admin" {
            return init_store(world, dir, email);
        }
        init_store(world, dir, INIT_ADMIN);
    }
    world
        .airlockd(world.tmp.path())
        .args(["admin", "user", "add", "--email", email, "--role", role])
        .args(store.admin_args())
        .run()
        .expect_code(0);
    token_for(world, store, email)
}

pub fn token_for(world: &World, store: &StoreSel, email: &str) -> String {
    let run = world
        .airlockd(world.tmp.path())
        .args(["admin", "token", "create", "--user", email])
        .args(store.admin_args())
        .run()
        .expect_code(0);
    let t = run.stdout().trim().to_string();
    assert!(t.starts_with("alk_"), "token: {t:?}");
    assert!(!run.stderr().contains(&t), "the secret must not appear on stderr");
    t
}

/// A self-signed certificate and key made by `airlockd review init-tls` in the world's tmp
/// directory (`cert.pem`, `key.pem`).
pub fn init_tls(world: &World) -> (PathBuf, PathBuf) {
    let cert = world.tmp.path().join("cert.pem");
    let key = world.tmp.path().join("key.pem");
    world
        .airlockd(world.tmp.path())
        .args(["review", "init-tls", "--cert"])
        .args([&cert])
        .args(["--key"])
        .args([&key])
        .run()
        .expect_code(0);
    (cert, key)
}

/// A running `airlockd review` killed on drop.
pub struct Server {
    pub child: Child,
    pub port: u16,
    pub base: String,
    pub log: PathBuf,
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

impl Server {
    pub fn start(world: &World, store: &StoreSel, extra: &[&str]) -> Self {
        Self::start_scheme(world, store, extra, "http")
    }

    pub fn start_scheme(world: &World, store: &StoreSel, extra: &[&str], scheme: &str) -> Self {
        Self::start_with_env(world, store, extra, scheme, &[])
    }

    /// [`Self::start_scheme`] with extra environment variables (test hooks) for the server.
    pub fn start_with_env(
        world: &World,
        store: &StoreSel,
        extra: &[&str],
        scheme: &str,
        env: &[(&str, &str)],
    ) -> Self {
        Self::spawn(world, store, extra, scheme, env, free_port())
    }

    /// [`Self::start`] on a given port: a server restarted on the port and store of one that
    /// was killed, so its clients' login still points at it.
    pub fn start_on(world: &World, store: &StoreSel, extra: &[&str], port: u16) -> Self {
        Self::spawn(world, store, extra, "http", &[], port)
    }

    fn spawn(
        world: &World,
        store: &StoreSel,
        extra: &[&str],
        scheme: &str,
        env: &[(&str, &str)],
        port: u16,
    ) -> Self {
        let log = world.tmp.path().join(format!("review-{port}.log"));
        let mut cmd = Command::new(bin("airlockd"));
        cmd.env_clear()
            .env("HOME", &world.home)
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .args(["review", "--listen", &format!("127.0.0.1:{port}")])
            .args(store.args())
            .args(extra)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // Appended: a server restarted on the same port keeps its predecessor's log.
            .stderr(std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap());
        let mut child = cmd.spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "server exited {status}: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            assert!(Instant::now() < deadline, "server did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { child, port, base: format!("{scheme}://127.0.0.1:{port}"), log }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP exchange's result.
#[derive(Debug)]
pub struct Http {
    pub status: u16,
    pub body: String,
    pub headers: String,
}

impl Http {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// Runs curl with `args` (plus -s, header dump and status capture).
pub fn curl(args: &[&str]) -> Http {
    let dir = tempfile::tempdir().unwrap();
    let hdr = dir.path().join("h");
    let out = Command::new("curl")
        .args(["-sS", "--noproxy", "*", "-D"])
        .arg(&hdr)
        .args(["-o", "-", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    Http {
        status: code.trim().parse().unwrap_or(0),
        body: body.to_string(),
        headers: std::fs::read_to_string(&hdr).unwrap_or_default(),
    }
}

/// POSTs `body` (a file) to /api/v1/events with the given content type and extra args.
pub fn post_events(
    base: &str,
    token: &str,
    body: &Path,
    content_type: &str,
    extra: &[&str],
) -> Http {
    let auth = format!("Authorization: Bearer {token}");
    let ct = format!("Content-Type: {content_type}");
    let url = format!("{base}/api/v1/events");
    let data = format!("@{}", body.display());
    let mut args = vec!["-H", &auth, "-H", &ct, "--data-binary", &data];
    args.extend_from_slice(extra);
    args.push(&url);
    curl(&args)
}

pub fn get(base: &str, token: &str, path: &str, extra: &[&str]) -> Http {
    let auth = format!("Authorization: Bearer {token}");
    let url = format!("{base}{path}");
    let mut args = vec!["-H", auth.as_str()];
    args.extend_from_slice(extra);
    args.push(&url);
    curl(&args)
}

pub fn write_file(dir: &Path, name: &str, data: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::File::create(&p).unwrap().write_all(data).unwrap();
    p
}

/// An egress envelope like `airlock publish` sends.
pub fn egress(id: &str, host: &str, allowed: bool) -> serde_json::Value {
    serde_json::json!({
        "id": id, "source": "egress", "type": "connect", "ts": "2026-03-04T09:12:05.118Z",
        "session": "sess-1", "seq": 1,
        "payload": {"id": id, "ts": "2026-03-04T09:12:05.118Z", "user_id": "local-user-id", "repo": "payments",
                    "host": host, "method": "CONNECT", "allowed": allowed, "port": 443, "boot": "boot-1"}
    })
}

/// A Claude Code transcript line wrapped in an envelope (id = the line's uuid).
pub fn claude(line: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "id": line["uuid"], "source": "claude", "type": line["type"], "ts": line["timestamp"],
        "session": line["sessionId"], "payload": line
    })
}

/// Every event visible to `token` (follows cursors).
pub fn all_events(base: &str, token: &str, query: &str) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("/api/v1/events?limit=1000{query}");
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let r = get(base, token, &path, &[]);
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        out.extend(v["events"].as_array().unwrap().iter().cloned());
        match v["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    out
}

/// `items` as an NDJSON body (one JSON value per line), as clients post batches.
pub fn ndjson(items: &[serde_json::Value]) -> Vec<u8> {
    items.iter().flat_map(|i| format!("{i}\n").into_bytes()).collect()
}
