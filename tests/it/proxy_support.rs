//! Helpers for the proxy suites: `airlockd proxy` under test, loopback upstreams (TLS with a
//! test CA, plain HTTP, echo) and sentinels that must never be dialed. Everything binds to
//! 127.0.0.0/8 only; names resolve only through the test resolver file.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::support::World;

/// `airlockd proxy` running in the foreground: the binary itself, or — with
/// `AIRLOCK_TEST_PROXY_ENGINE=podman|docker`, as `container_backend`'s suite run sets it inside
/// its sealed namespace — the same command in the proxy image (`airlock/proxy`, what a
/// container session's proxy runs), so every proxy and audit test here also runs against the
/// proxy container.
pub struct ProxyProc {
    /// The proxy, or the engine CLI attached to its container.
    pub child: Child,
    /// `(engine, container name)` when it runs in a container.
    pub container: Option<(String, String)>,
    pub addr: SocketAddr,
    pub log_dir: PathBuf,
    pub queries: PathBuf,
    pub stdout: Arc<Mutex<String>>,
    pub stderr: Arc<Mutex<String>>,
}

impl ProxyProc {
    /// Starts the proxy with `config` (operator file) and `resolver` lines; `args` are extra
    /// flags. Waits until it listens.
    pub fn start(world: &World, tag: &str, config: &str, resolver: &str, args: &[&str]) -> Self {
        let cfg = world.write(world.tmp.path().join(format!("{tag}.toml")), config);
        let res = world.write(world.tmp.path().join(format!("{tag}.resolver")), resolver);
        let log_dir = world.tmp.path().join(format!("{tag}-logs"));
        Self::start_with(world, &cfg, &res, &log_dir, args)
    }

    pub fn start_with(
        world: &World,
        cfg: &Path,
        res: &Path,
        log_dir: &Path,
        args: &[&str],
    ) -> Self {
        let queries = PathBuf::from(format!("{}.queries", res.display()));
        let mut cmd = world
            .airlockd(world.tmp.path())
            .args(["proxy", "--repo-name", "demo", "--listen", "127.0.0.1:0"])
            .args(["--config".as_ref(), cfg.as_os_str()])
            .args(["--log-dir".as_ref(), log_dir.as_os_str()])
            .args(["--user-id", "u-test"])
            .args(args)
            .env("AIRLOCK_TEST_RESOLVER", res)
            .cmd;
        let container = proxy_engine().map(|engine| {
            static N: AtomicUsize = AtomicUsize::new(0);
            let name = format!(
                "airlock-suite-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            );
            cmd = in_container(&engine, &name, &cmd, world.tmp.path());
            (engine, name)
        });
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let stdout = Arc::new(Mutex::new(String::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel::<SocketAddr>();
        let err_buf = Arc::clone(&stderr);
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("listening on ").nth(1)
                    && let Some(a) = rest.split_whitespace().next()
                    && let Ok(a) = a.parse()
                {
                    let _ = tx.send(a);
                }
                let mut b = err_buf.lock().unwrap();
                b.push_str(&line);
                b.push('\n');
            }
        });
        let out_buf = Arc::clone(&stdout);
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let mut b = out_buf.lock().unwrap();
                b.push_str(&line);
                b.push('\n');
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(a) => a,
            Err(_) => {
                let _ = child.kill();
                panic!("proxy did not start:\n{}", stderr.lock().unwrap());
            }
        };
        if let Some((engine, name)) = &container {
            // It is the container that listens: the engine knows it as running, and the
            // suite's run counts it (container_backend's check that these tests used it).
            let state = std::process::Command::new(engine)
                .args(["inspect", "--format", "{{.State.Running}}", name])
                .output()
                .unwrap();
            assert_eq!(String::from_utf8_lossy(&state.stdout).trim(), "true", "{name}");
            if let Some(log) = std::env::var_os("AIRLOCK_TEST_PROXY_ENGINE_LOG") {
                let mut f =
                    std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
                writeln!(f, "{name}").unwrap();
            }
        }
        Self { child, container, addr, log_dir: log_dir.to_path_buf(), queries, stdout, stderr }
    }

    /// Sends the proxy `signal` (in a container: through the engine, to its PID 1, which is
    /// `airlockd`) and waits for it to end.
    pub fn signal_and_wait(
        &mut self,
        signal: nix::sys::signal::Signal,
    ) -> std::process::ExitStatus {
        match &self.container {
            None => {
                let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap());
                nix::sys::signal::kill(pid, signal).unwrap();
            }
            Some((engine, name)) => {
                let ok = std::process::Command::new(engine)
                    .args(["kill", "--signal", signal.as_str(), name])
                    .stdout(Stdio::null())
                    .status()
                    .unwrap();
                assert!(ok.success(), "{engine} kill --signal {signal} {name}");
            }
        }
        self.child.wait().unwrap()
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every audit line written so far, parsed.
    pub fn audit(&self) -> Vec<serde_json::Value> {
        audit_lines(&self.log_dir)
    }

    /// Polls until `pred` holds for the audit lines (or 10 s pass), then returns them.
    pub fn wait_audit(
        &self,
        pred: impl Fn(&[serde_json::Value]) -> bool,
    ) -> Vec<serde_json::Value> {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let lines = self.audit();
            if pred(&lines) || Instant::now() > until {
                return lines;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Names the test resolver was asked for, in order. The log must exist: the resolver
    /// creates it with its first query, so a test asserting that a name was *not* resolved
    /// first makes the proxy resolve one that is (or the assertion would hold with the log, or
    /// the test resolver, missing).
    #[track_caller]
    pub fn queries(&self) -> Vec<String> {
        let text = match std::fs::read_to_string(&self.queries) {
            Ok(text) => text,
            Err(e) => panic!(
                "resolver log {} unreadable ({e}): no query reached the test resolver",
                self.queries.display()
            ),
        };
        text.lines().map(str::to_owned).collect()
    }

    pub fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    /// The console output once it contains `needle` (or after 10 s): a reader thread collects
    /// stdout, so a line the proxy printed may not have arrived yet.
    pub fn wait_stdout(&self, needle: &str) -> String {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let out = self.stdout();
            if out.contains(needle) || Instant::now() > until {
                return out;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Raw TCP connection to the proxy.
    pub fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s
    }

    /// Sends `head` and returns the proxy's response head plus the socket.
    pub fn ask(&self, head: &str) -> (TcpStream, String) {
        let mut s = self.connect();
        s.write_all(head.as_bytes()).unwrap();
        let resp = read_head(&mut s);
        (s, resp)
    }
}

impl Drop for ProxyProc {
    fn drop(&mut self) {
        if let Some((engine, name)) = &self.container {
            let _ = std::process::Command::new(engine)
                .args(["rm", "-f", name])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The engine to run the proxy in, when the suite is asked to (`AIRLOCK_TEST_PROXY_ENGINE`).
pub fn proxy_engine() -> Option<String> {
    std::env::var("AIRLOCK_TEST_PROXY_ENGINE").ok().filter(|e| !e.is_empty())
}

/// `cmd` (an `airlockd` command with a cleared environment) as `ENGINE run` of the proxy image:
/// the engine's network namespace is the test's own (`--network host`: the namespace
/// `sealed.sh` made, where the loopback upstreams listen), `dir` (every file the test hands
/// the proxy) bound at its own path, the same environment, the caller's uid, no capabilities.
fn in_container(
    engine: &str,
    name: &str,
    cmd: &std::process::Command,
    dir: &Path,
) -> std::process::Command {
    let image =
        std::env::var("AIRLOCK_TEST_PROXY_IMAGE").unwrap_or_else(|_| "airlock/proxy:latest".into());
    let mut c = std::process::Command::new(engine);
    c.args(["run", "--rm", "--name", name, "--network", "host", "--pull=never"]);
    c.args(["--cap-drop", "ALL", "--security-opt", "no-new-privileges"]);
    let (uid, gid) = (nix::unistd::getuid(), nix::unistd::getgid());
    c.arg("--user").arg(format!("{uid}:{gid}"));
    c.arg("--volume").arg(format!("{}:{}", dir.display(), dir.display()));
    if let Some(cwd) = cmd.get_current_dir() {
        c.arg("--workdir").arg(cwd);
    }
    for (k, v) in cmd.get_envs() {
        // The image's own PATH; the rest as the test set it.
        if let (Some(v), false) = (v, k == "PATH") {
            let mut kv = k.to_owned();
            kv.push("=");
            kv.push(v);
            c.arg("--env").arg(kv);
        }
    }
    c.args(["--entrypoint", "/usr/local/bin/airlockd", &image]);
    c.args(cmd.get_args());
    c.stdin(Stdio::null());
    c
}

/// Reads one response head (through the blank line) byte by byte.
pub fn read_head(s: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut b) {
            Ok(1) => head.push(b[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// All audit lines in `dir` (every `audit-*.jsonl`).
pub fn audit_lines(dir: &Path) -> Vec<serde_json::Value> {
    crate::support::jsonl_lines(dir, "audit-")
}

/// A test CA and a leaf certificate for `names`.
pub struct TestPki {
    pub ca_pem: String,
    pub leaf: rustls::pki_types::CertificateDer<'static>,
    pub key_der: Vec<u8>,
}

impl TestPki {
    pub fn new(names: &[&str]) -> Self {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
        };
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, "airlock test CA");
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);
        let leaf_key = KeyPair::generate().unwrap();
        let leaf_params =
            CertificateParams::new(names.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
                .unwrap();
        let leaf = leaf_params.signed_by(&leaf_key, &issuer).unwrap();
        Self { ca_pem: ca_cert.pem(), leaf: leaf.der().clone(), key_der: leaf_key.serialize_der() }
    }

    pub fn write_ca(&self, world: &World, tag: &str) -> PathBuf {
        world.write(world.tmp.path().join(format!("{tag}-ca.pem")), &self.ca_pem)
    }

    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(self.key_der.clone().into());
        let cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![self.leaf.clone()], key)
            .unwrap();
        Arc::new(cfg)
    }

    pub fn client_config(&self) -> Arc<rustls::ClientConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        let der = rustls::pki_types::CertificateDer::from_pem_slice(self.ca_pem.as_bytes());
        roots.add(der.unwrap()).unwrap();
        let cfg = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        Arc::new(cfg)
    }
}

use rustls::pki_types::pem::PemObject;

/// What an upstream does with each connection.
#[derive(Clone)]
pub enum Serve {
    /// HTTP/1.1: `hello from NAME` (and the request head) or files under a directory.
    Http { name: String, root: Option<PathBuf> },
    /// Echo bytes back.
    Echo,
}

/// A loopback server on its own runtime; counts accepted connections.
pub struct Upstream {
    pub addr: SocketAddr,
    pub hits: Arc<AtomicUsize>,
    _rt: tokio::runtime::Runtime,
}

impl Upstream {
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    /// The accept count once it reaches `n` (or after 10 s, whatever it is then). The proxy
    /// sees a dial complete as soon as the connection is in this listener's backlog, which can
    /// be before this upstream's task has accepted and counted it.
    pub fn hits_at_least(&self, n: usize) -> usize {
        let until = Instant::now() + Duration::from_secs(10);
        while self.hits() < n && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.hits()
    }

    /// `tls`: terminate TLS with this config first.
    pub fn start(addr: &str, serve: Serve, tls: Option<Arc<rustls::ServerConfig>>) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind(addr))
            .unwrap_or_else(|e| panic!("cannot bind upstream {addr}: {e} (tests run as root)"));
        let bound = listener.local_addr().unwrap();
        let hits = Arc::new(AtomicUsize::new(0));
        let h = Arc::clone(&hits);
        rt.spawn(async move {
            let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
            while let Ok((sock, _)) = listener.accept().await {
                h.fetch_add(1, Ordering::SeqCst);
                let serve = serve.clone();
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    match acceptor {
                        Some(a) => {
                            if let Ok(s) = a.accept(sock).await {
                                run(s, serve).await;
                            }
                        }
                        None => run(sock, serve).await,
                    }
                });
            }
        });
        Self { addr: bound, hits, _rt: rt }
    }

    /// A listener that must never receive a connection.
    pub fn sentinel(addr: &str) -> Self {
        Self::start(addr, Serve::Echo, None)
    }
}

async fn run<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, serve: Serve) {
    match serve {
        Serve::Echo => {
            let mut buf = vec![0u8; 65536];
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => {
                        let _ = s.shutdown().await;
                        return;
                    }
                    Ok(n) => {
                        if s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                }
            }
        }
        Serve::Http { name, root } => loop {
            let mut head = Vec::new();
            let mut b = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                match s.read(&mut b).await {
                    Ok(1) => head.push(b[0]),
                    _ => return,
                }
                if head.len() > 65536 {
                    return;
                }
            }
            let head = String::from_utf8_lossy(&head).into_owned();
            let path = head.split(' ').nth(1).unwrap_or("/").to_owned();
            let (status, body) = match &root {
                None => {
                    ("200 OK", format!("hello from {name}\n--- upstream saw:\n{head}").into_bytes())
                }
                Some(root) => {
                    let rel = path.split('?').next().unwrap_or("/").trim_start_matches('/');
                    let file = root.join(rel);
                    match (rel.contains(".."), std::fs::read(&file)) {
                        (false, Ok(bytes)) => ("200 OK", bytes),
                        _ => ("404 Not Found", b"not found\n".to_vec()),
                    }
                }
            };
            let resp = format!(
                "HTTP/1.1 {status}\r\nContent-Length: {}\r\nContent-Type: text/plain\r\n\r\n",
                body.len()
            );
            if s.write_all(resp.as_bytes()).await.is_err() || s.write_all(&body).await.is_err() {
                return;
            }
        },
    }
}

/// `curl ARGS` with a clean environment; returns (exit code, stdout, stderr).
pub fn curl(args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new("curl")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .args(["--silent", "--show-error", "--max-time", "20"])
        .args(args)
        .output()
        .expect("curl is a test prerequisite");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Lines matching `host` (and optionally `allowed`).
pub fn lines_for<'a>(lines: &'a [serde_json::Value], host: &str) -> Vec<&'a serde_json::Value> {
    lines.iter().filter(|l| l["host"] == host).collect()
}
