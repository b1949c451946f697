//! TLS to PostgreSQL with `sslmode=verify-full` semantics, on a throwaway cluster this test
//! makes with `initdb` and runs as an unprivileged user (`nobody`, or the CI's `airlock-ci`
//! when it exists; the test's own user when not root) on a loopback port it picks, with a CA
//! it generates — never by reconfiguring the shared server on 5432.
//!
//! verify-full passes with the right CA and host (URL `sslrootcert=` and `--database-ca`), and
//! the server's own connections are TLS; it fails with another CA and with a host name the
//! certificate does not carry; and a server without TLS is refused, not used in plain.

use crate::review_support::{Server, StoreSel, get};
use crate::support::{World, in_ci};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A PostgreSQL binary from PATH or a Debian-style install.
fn pg_bin(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    if let Ok(rd) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut vers: Vec<PathBuf> = rd.flatten().map(|e| e.path().join("bin")).collect();
        vers.sort();
        dirs.extend(vers.into_iter().rev());
    }
    dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file())
}

/// The uid/gid the cluster runs as: an unprivileged user when we are root (initdb refuses
/// root), else ourselves.
fn cluster_user() -> Option<(u32, u32)> {
    if !nix::unistd::geteuid().is_root() {
        return None;
    }
    for name in ["airlock-ci", "nobody"] {
        if let Ok(Some(u)) = nix::unistd::User::from_name(name) {
            return Some((u.uid.as_raw(), u.gid.as_raw()));
        }
    }
    panic!("running as root and no unprivileged user (airlock-ci, nobody) to run initdb as");
}

/// `bin args…` as the cluster user (`setpriv` execs, so the child is the program itself).
fn as_cluster_user(user: Option<(u32, u32)>, bin: &Path) -> Command {
    match user {
        Some((uid, gid)) => {
            let mut c = Command::new("setpriv");
            c.args([format!("--reuid={uid}"), format!("--regid={gid}"), "--clear-groups".into()])
                .arg("--")
                .arg(bin);
            c
        }
        None => Command::new(bin),
    }
}

fn chown(p: &Path, user: Option<(u32, u32)>) {
    if let Some((uid, gid)) = user {
        std::os::unix::fs::chown(p, Some(uid), Some(gid)).unwrap();
    }
}

fn write_owned(p: &Path, data: &str, mode: u32, user: Option<(u32, u32)>) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(p, data).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    chown(p, user);
}

/// A cluster made by initdb under a temp dir; stopped (fast shutdown) on drop.
struct Cluster {
    _dir: tempfile::TempDir,
    data: PathBuf,
    sock: PathBuf,
    port: u16,
    user: Option<(u32, u32)>,
    postgres: PathBuf,
    child: Option<Child>,
    log: PathBuf,
}

impl Cluster {
    /// `None` (with a note) when PostgreSQL's server binaries are missing outside CI.
    fn init() -> Option<Self> {
        let (Some(initdb), Some(postgres)) = (pg_bin("initdb"), pg_bin("postgres")) else {
            assert!(!in_ci(), "initdb/postgres not found in CI");
            eprintln!("SKIP: initdb/postgres not found");
            return None;
        };
        let user = cluster_user();
        let dir = tempfile::Builder::new().prefix("airlock-pgtls-").tempdir().unwrap();
        use std::os::unix::fs::PermissionsExt;
        // The cluster user must reach its directories inside ours.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let data = dir.path().join("data");
        let sock = dir.path().join("sock");
        for d in [&data, &sock] {
            std::fs::create_dir(d).unwrap();
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).unwrap();
            chown(d, user);
        }
        let out = as_cluster_user(user, &initdb)
            .args(["-D"])
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"])
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "initdb: {}", String::from_utf8_lossy(&out.stderr));
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let log = dir.path().join("postgres.log");
        Some(Self { _dir: dir, data, sock, port, user, postgres, child: None, log })
    }

    /// Writes the server's certificate and key into the data dir (owned by the cluster user,
    /// key 0600 as PostgreSQL demands).
    fn install_cert(&self, cert_pem: &str, key_pem: &str) {
        write_owned(&self.data.join("server.crt"), cert_pem, 0o644, self.user);
        write_owned(&self.data.join("server.key"), key_pem, 0o600, self.user);
    }

    fn start(&mut self, ssl: bool) {
        let log = std::fs::File::create(&self.log).unwrap();
        let mut cmd = as_cluster_user(self.user, &self.postgres);
        cmd.arg("-D")
            .arg(&self.data)
            .args(["-p", &self.port.to_string(), "-c", "listen_addresses=127.0.0.1", "-c"])
            .arg(format!("unix_socket_directories={}", self.sock.display()))
            .args(["-c", "fsync=off", "-c", if ssl { "ssl=on" } else { "ssl=off" }])
            .current_dir(&self.data)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        self.child = Some(cmd.spawn().unwrap());
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ok = Command::new("psql")
                .args([&self.plain_url("postgres", "postgres"), "-qAt", "-c", "SELECT 1"])
                .output()
                .is_ok_and(|o| o.status.success());
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "cluster did not start: {}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
            let deadline = Instant::now() + Duration::from_secs(30);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// A plain (non-TLS) URL, for the test's own setup.
    fn plain_url(&self, user: &str, db: &str) -> String {
        format!("postgres://{user}@127.0.0.1:{}/{db}?sslmode=disable", self.port)
    }

    fn sql(&self, sql: &str) -> String {
        let out = Command::new("psql")
            .args([
                &self.plain_url("postgres", "airlock"),
                "-v",
                "ON_ERROR_STOP=1",
                "-qAt",
                "-c",
                sql,
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{sql}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A CA (distinct name per call) and, if `host` is given, a server certificate for it.
fn ca(name: &str) -> (rcgen::CertificateParams, rcgen::KeyPair, String) {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.distinguished_name.push(rcgen::DnType::CommonName, name);
    params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
    let key = rcgen::KeyPair::generate().unwrap();
    let pem = params.self_signed(&key).unwrap().pem();
    (params, key, pem)
}

const HOST: &str = "pg.airlock.test";

#[test]
fn pg_tls_verify_full_checks_ca_and_host_and_refuses_plain() {
    let Some(mut cluster) = Cluster::init() else { return };
    let world = World::new();
    let dir = world.tmp.path();
    let (ca_params, ca_key, ca_pem) = ca("airlock test CA");
    let (_, _, other_ca_pem) = ca("another CA");
    let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
    let server_key = rcgen::KeyPair::generate().unwrap();
    let server_cert = rcgen::CertificateParams::new(vec![HOST.to_string()])
        .unwrap()
        .signed_by(&server_key, &issuer)
        .unwrap();
    cluster.install_cert(&server_cert.pem(), &server_key.serialize_pem());
    let ca_file = dir.join("ca.pem");
    let other_ca_file = dir.join("other-ca.pem");
    std::fs::write(&ca_file, &ca_pem).unwrap();
    std::fs::write(&other_ca_file, &other_ca_pem).unwrap();
    cluster.start(true);
    let out = Command::new("psql")
        .args([&cluster.plain_url("postgres", "postgres"), "-qAt", "-c", "CREATE DATABASE airlock"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    cluster.sql("CREATE ROLE rt LOGIN; CREATE ROLE adm LOGIN");

    // `host` is what the certificate must name; `hostaddr` is where to connect.
    let url = |user: &str, host: &str, ca: Option<&Path>| {
        let mut u = format!(
            "postgres://{user}@{host}:{}/airlock?hostaddr=127.0.0.1&sslmode=verify-full",
            cluster.port
        );
        if let Some(ca) = ca {
            u.push_str(&format!("&sslrootcert={}", ca.display()));
        }
        u
    };
    let airlockd = |args: &[&str]| world.airlockd(dir).args(args).run();

    // Right CA (in the URL) and right host: migrate, as the owner, over TLS.
    let owner = url("postgres", HOST, Some(&ca_file));
    let run = airlockd(&[
        "review",
        "migrate",
        "--database",
        &owner,
        "--runtime-role",
        "rt",
        "--admin-role",
        "adm",
    ]);
    assert_eq!(run.code(), 0, "{}", run.stderr());
    // Right CA by --database-ca (the URL names none).
    let admin = url("adm", HOST, None);
    let ca_arg = ca_file.display().to_string();
    let run = airlockd(&[
        "admin",
        "user",
        "add",
        "--email",
        "ana@example.test",
        "--role",
        "reviewer",
        "--database",
        &admin,
        "--database-ca",
        &ca_arg,
    ]);
    assert_eq!(run.code(), 0, "{}", run.stderr());
    let run = airlockd(&[
        "admin",
        "token",
        "create",
        "--user",
        "ana@example.test",
        "--database",
        &admin,
        "--database-ca",
        &ca_arg,
    ]);
    assert_eq!(run.code(), 0, "{}", run.stderr());
    let token = run.stdout().trim().to_string();

    // The server's own connections are TLS (the server's view: pg_stat_ssl).
    let runtime = url("rt", HOST, Some(&ca_file));
    let server = Server::start(&world, &StoreSel::Pg(runtime.clone()), &[]);
    let me = get(&server.base, &token, "/api/v1/me", &[]);
    assert_eq!(me.status, 200, "{}: {}", me.body, server.log());
    assert_eq!(
        cluster.sql(
            "SELECT count(*) FILTER (WHERE s.ssl) > 0 AND count(*) FILTER (WHERE NOT s.ssl) = 0
             FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.usename = 'rt'"
        ),
        "t"
    );
    drop(server);

    // Another CA: refused (the URL's sslrootcert wins over a right --database-ca).
    let wrong_ca = url("adm", HOST, Some(&other_ca_file));
    let run =
        airlockd(&["admin", "user", "list", "--database", &wrong_ca, "--database-ca", &ca_arg]);
    assert_eq!(run.code(), 1, "{}", run.stdout());
    assert!(run.stderr().contains("invalid peer certificate"), "{}", run.stderr());
    assert!(!run.stdout().contains("ana@example.test"));
    // A host name the certificate does not carry (same address): refused.
    let wrong_host = url("adm", "other.airlock.test", Some(&ca_file));
    let run = airlockd(&["admin", "user", "list", "--database", &wrong_host]);
    assert_eq!(run.code(), 1, "{}", run.stdout());
    assert!(
        run.stderr().contains("invalid peer certificate")
            && run.stderr().contains("not valid for name"),
        "{}",
        run.stderr()
    );
    // An IP address host is checked against the certificate's addresses (it has none).
    let ip_host = url("adm", "127.0.0.1", Some(&ca_file));
    let run = airlockd(&["admin", "user", "list", "--database", &ip_host]);
    assert_eq!(run.code(), 1, "{}", run.stdout());
    // The right URL still works (so the refusals above are the certificate's).
    let good = url("adm", HOST, Some(&ca_file));
    let run = airlockd(&["admin", "user", "list", "--database", &good]);
    assert_eq!(run.code(), 0, "{}", run.stderr());
    assert!(run.stdout().contains("ana@example.test"));

    // The same server without TLS: a URL demanding TLS is refused, never served in plain.
    cluster.stop();
    cluster.start(false);
    let run = airlockd(&["admin", "user", "list", "--database", &good]);
    assert_eq!(run.code(), 1, "{}", run.stdout());
    assert!(run.stderr().contains("does not support TLS"), "{}", run.stderr());
    let plain = format!("postgres://adm@127.0.0.1:{}/airlock", cluster.port);
    let run = airlockd(&["admin", "user", "list", "--database", &plain]);
    assert_eq!(run.code(), 0, "plain without sslmode works: {}", run.stderr());
    // The server refuses to start on it too.
    let run = world
        .airlockd(dir)
        .args(["review", "--listen", "127.0.0.1:0", "--database", &runtime])
        .run();
    assert_eq!(run.code(), 1, "{}", run.stderr());
    assert!(run.stderr().contains("does not support TLS"), "{}", run.stderr());
}
