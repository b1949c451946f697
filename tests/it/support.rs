//! Helpers that make tests read like a user's session: a throwaway HOME, a repo directory,
//! and commands run against the real binaries with a clean environment.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Path of one of our binaries. `AIRLOCK_TEST_BIN_DIR` lets CI run the suite as an
/// unprivileged user against copies it can read; otherwise cargo's build output.
pub fn bin(name: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os("AIRLOCK_TEST_BIN_DIR") {
        return PathBuf::from(dir).join(name);
    }
    match name {
        "airlock" => PathBuf::from(env!("CARGO_BIN_EXE_airlock")),
        "airlockd" => PathBuf::from(env!("CARGO_BIN_EXE_airlockd")),
        other => panic!("unknown binary {other}"),
    }
}

/// True in CI, where a missing prerequisite must fail the test instead of skipping it.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// The directory Worlds are made in: `AIRLOCK_TEST_WORLD_DIR`, else `/var/tmp`. Never `/tmp`:
/// inside the sandbox `/tmp` is always a private tmpfs, so a host home under it would be
/// invisible whatever the mounts did, and "the host's `~/.ssh` is invisible" would pass with
/// the host tree exposed. The sandbox shows nothing of `/var`, so a home there is hidden only
/// by the mount plan under test. `/var/tmp` is sticky and world-writable like `/tmp`, so the
/// unprivileged CI user (`.ci/unprivileged`) makes its Worlds there too.
pub fn world_parent() -> PathBuf {
    let dir = std::env::var_os("AIRLOCK_TEST_WORLD_DIR")
        .map_or_else(|| PathBuf::from("/var/tmp"), PathBuf::from);
    assert!(
        !dir.starts_with("/tmp"),
        "test Worlds must not live under /tmp (the sandbox's private tmpfs): {}",
        dir.display()
    );
    dir
}

/// How many inputs a sampling loop (a fuzz loop) tries: `wanted`, capped by
/// `AIRLOCK_IT_MAX_ITERATIONS` (`.ci/run` sets it so the suite keeps within its time budget as
/// it grows; docs/testing.md).
pub fn iterations(wanted: usize) -> usize {
    match std::env::var("AIRLOCK_IT_MAX_ITERATIONS") {
        Ok(cap) => {
            let cap: usize = cap.parse().unwrap_or_else(|_| {
                panic!("AIRLOCK_IT_MAX_ITERATIONS={cap:?} is not a number of iterations")
            });
            wanted.min(cap)
        }
        Err(_) => wanted,
    }
}

/// A user's world: a HOME (with `~/.airlock`), a managed-policy path, and a repo dir, in a
/// fresh directory under [`world_parent`] that is removed when the World is dropped.
pub struct World {
    pub tmp: tempfile::TempDir,
    pub home: PathBuf,
    pub managed: PathBuf,
}

impl World {
    pub fn new() -> Self {
        let tmp = tempfile::Builder::new()
            .prefix("airlock-world-")
            .tempdir_in(world_parent())
            .unwrap_or_else(|e| panic!("cannot make a World in {}: {e}", world_parent().display()));
        let home = tmp.path().join("home");
        std::fs::create_dir_all(&home).unwrap();
        let managed = tmp.path().join("etc-airlock-policy.toml");
        Self { tmp, home, managed }
    }

    /// Creates `name` as a git-like repo directory (a `.git` dir) and returns its path.
    pub fn repo(&self, name: &str) -> PathBuf {
        let dir = self.tmp.path().join(name);
        std::fs::create_dir_all(dir.join(".git")).unwrap();
        dir
    }

    /// Writes a file, creating parent directories.
    pub fn write(&self, path: impl AsRef<Path>, contents: &str) -> PathBuf {
        let path = path.as_ref().to_path_buf();
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&path, contents).unwrap();
        path
    }

    /// Writes an executable file (mode 0755), creating parent directories.
    pub fn write_executable(&self, path: impl AsRef<Path>, contents: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = self.write(path, contents);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    /// `airlock ARGS` run in `cwd` with only this world's environment.
    pub fn airlock(&self, cwd: &Path) -> TestCommand {
        self.command("airlock", cwd)
    }

    /// `airlockd ARGS` run in `cwd` with only this world's environment.
    pub fn airlockd(&self, cwd: &Path) -> TestCommand {
        self.command("airlockd", cwd)
    }

    fn command(&self, name: &str, cwd: &Path) -> TestCommand {
        let mut cmd = Command::new(bin(name));
        cmd.current_dir(cwd)
            .env_clear()
            .env("HOME", &self.home)
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("AIRLOCK_TEST_MANAGED_POLICY", &self.managed)
            .stdin(Stdio::null());
        TestCommand { cmd }
    }
}

/// A repo to run `airlock exec` in, with the test-only `hold` bridge: the proxy listener
/// exists and nothing serves it, so nothing a session does can reach the network.
pub struct Sandbox {
    pub world: World,
    pub repo: PathBuf,
}

impl Sandbox {
    pub fn new(name: &str) -> Self {
        let world = World::new();
        let repo = world.repo(name);
        Self::with(world, repo)
    }

    /// A user layer allowing a test name, so the effective allowlist is not empty.
    pub fn with(world: World, repo: PathBuf) -> Self {
        world.write(
            world.home.join(".airlock/config.toml"),
            "[network]\nallow = [\"example.test\"]\n",
        );
        Self { world, repo }
    }

    /// `airlock exec -- ARGS` with the `hold` bridge, a test hook: tests using it exist only in
    /// `test-hooks` builds (a build without hooks would start a real daemon instead).
    #[cfg(feature = "test-hooks")]
    pub fn exec<S: AsRef<OsStr>>(&self, args: &[S]) -> TestCommand {
        self.world
            .airlock(&self.repo)
            .hook("AIRLOCK_TEST_PROXY_BRIDGE", "hold")
            .args(["exec", "--"])
            .args(args)
    }

    /// `sh -c SCRIPT` inside.
    #[cfg(feature = "test-hooks")]
    pub fn sh(&self, script: &str) -> Run {
        self.exec(&["sh", "-c", script]).run()
    }

    /// `python3 -c CODE` inside.
    #[cfg(feature = "test-hooks")]
    pub fn py(&self, code: &str) -> Run {
        self.exec(&["python3", "-c", code]).run()
    }

    pub fn home(&self) -> &Path {
        &self.world.home
    }

    /// `airlock policy trust` for the sandbox's repo.
    pub fn trust(&self) {
        self.world.airlock(&self.repo).args(["policy", "trust"]).run().expect_code(0);
    }
}

/// What a command writes to a terminal the test gave it: the pty's master side, read by a
/// thread until every slave descriptor is closed.
pub struct PtyOutput {
    rx: std::sync::mpsc::Receiver<Vec<u8>>,
    /// Everything read so far.
    pub seen: Vec<u8>,
}

impl PtyOutput {
    pub fn read(master: &std::fs::File) -> Self {
        use std::io::Read;
        let mut reader = master.try_clone().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // A pty master reads EIO once the last slave descriptor is closed.
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        Self { rx, seen: Vec::new() }
    }

    /// Waits (up to 20 s, then fails the test) until `needle` has been written.
    #[track_caller]
    pub fn wait_for(&mut self, needle: &[u8]) {
        while !self.seen.windows(needle.len()).any(|w| w == needle) {
            match self.rx.recv_timeout(std::time::Duration::from_secs(20)) {
                Ok(chunk) => self.seen.extend_from_slice(&chunk),
                Err(_) => panic!(
                    "{:?} never arrived; the terminal got {:?}",
                    needle.escape_ascii().to_string(),
                    self.seen.escape_ascii().to_string()
                ),
            }
        }
    }

    /// Everything written until the last slave descriptor closed (at most 20 s).
    #[track_caller]
    pub fn until_closed(mut self) -> Vec<u8> {
        let end = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let left = end.saturating_duration_since(std::time::Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(chunk) => self.seen.extend_from_slice(&chunk),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return self.seen,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    panic!("the terminal was never closed; got {:?}", self.seen.escape_ascii())
                }
            }
        }
    }
}

/// A command under construction; `run()` captures its output.
pub struct TestCommand {
    pub cmd: Command,
}

impl TestCommand {
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.cmd.args(args);
        self
    }

    pub fn env(mut self, key: &str, value: impl AsRef<OsStr>) -> Self {
        self.cmd.env(key, value);
        self
    }

    /// Sets a test-hook variable (`AIRLOCK_TEST_*`, read by the binaries only when built with
    /// `test-hooks`). Exists only in `test-hooks` builds, so a test relying on a hook cannot
    /// compile into the suite that runs against the binaries users install.
    #[cfg(feature = "test-hooks")]
    pub fn hook(self, key: &str, value: impl AsRef<OsStr>) -> Self {
        assert!(key.starts_with("AIRLOCK_TEST_"), "{key} is not a test hook");
        self.env(key, value)
    }

    pub fn run(mut self) -> Run {
        let output = self.cmd.output().unwrap();
        Run { output }
    }
}

/// A finished command's status and output.
pub struct Run {
    pub output: Output,
}

impl Run {
    pub fn code(&self) -> i32 {
        self.output.status.code().unwrap_or(-1)
    }
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout).into_owned()
    }
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }
    /// Asserts the exit code, showing both streams on failure.
    #[track_caller]
    pub fn expect_code(self, code: i32) -> Self {
        assert_eq!(
            self.code(),
            code,
            "unexpected exit code\n--- stdout\n{}\n--- stderr\n{}",
            self.stdout(),
            self.stderr()
        );
        self
    }
}

/// Every line of `dir/<prefix>*.jsonl`, parsed, files in name (date) order; none if `dir` is
/// absent. A line that is not JSON fails the test.
pub fn jsonl_lines(dir: &Path, prefix: &str) -> Vec<serde_json::Value> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix) && n.ends_with(".jsonl"))
        })
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        for l in std::fs::read_to_string(&f).unwrap_or_default().lines() {
            out.push(serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line {l:?}: {e}")));
        }
    }
    out
}

impl World {
    /// The repo's audit lines (`~/.airlock/logs/<repo>/audit-*.jsonl`).
    pub fn audit_lines(&self, repo: &str) -> Vec<serde_json::Value> {
        jsonl_lines(&self.home.join(".airlock/logs").join(repo), "audit-")
    }

    /// The repo's session records (`~/.airlock/logs/<repo>/sessions-*.jsonl`).
    pub fn session_records(&self, repo: &str) -> Vec<serde_json::Value> {
        jsonl_lines(&self.home.join(".airlock/logs").join(repo), "sessions-")
    }
}

/// Polls `f` until it holds or `timeout` passes; whether it held.
pub fn wait_until(timeout: std::time::Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    f()
}

/// A tool the tests drive, from `/usr/bin` (what the sandbox shows); missing in CI is a
/// failure, elsewhere a loud skip.
pub fn have(tool: &str) -> bool {
    let found = Path::new("/usr/bin").join(tool).exists();
    assert!(found || !in_ci(), "prerequisite {tool} missing in /usr/bin (CI must have it)");
    if !found {
        eprintln!("SKIP: {tool} not installed in /usr/bin");
    }
    found
}

/// An HTTP server on `ip` answering every request with `body`: its port, and a count of the
/// connections it accepted.
pub fn http_upstream(
    ip: &str,
    body: &'static str,
) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{Read as _, Write as _};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let l = std::net::TcpListener::bind((ip, 0)).unwrap();
    let port = l.local_addr().unwrap().port();
    let hits = Arc::new(AtomicUsize::new(0));
    let h = Arc::clone(&hits);
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            h.fetch_add(1, Ordering::SeqCst);
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let _ = c.read(&mut buf);
                let _ = write!(
                    c,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    (port, hits)
}

/// `airlock ARGS` in `cwd` with `stdin` written to its standard input (a login's
/// `--token-stdin`), the world's HOME and nothing else of the caller's environment.
pub fn airlock_stdin(world: &World, cwd: &Path, args: &[&str], stdin: &str) -> Run {
    use std::io::Write;
    let mut cmd = Command::new(bin("airlock"));
    cmd.current_dir(cwd)
        .env_clear()
        .env("HOME", &world.home)
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    // A command that refuses before reading stdin closes it: that is its answer, not ours.
    match child.stdin.take().unwrap().write_all(stdin.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        r => r.unwrap(),
    }
    Run { output: child.wait_with_output().unwrap() }
}
