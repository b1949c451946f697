//! A private OpenSSH server for the tests (Debian `openssh-server`'s `/usr/sbin/sshd`), started
//! on the host side on a loopback address `127.0.0.x` with its own host key, its own
//! `sshd_config` and one authorised client key it generated, authenticating the user the tests
//! run as. Killed when dropped.
//!
//! As root it listens on port 22 (what `ssh git@host` uses) plus a second, high port; as an
//! unprivileged user (`.ci/unprivileged`; `net.ipv4.ip_unprivileged_port_start` is 1024 on
//! these machines) on two high ports. Tests read [`Sshd::ports`] and write policy entries
//! naming them. The server logs at `VERBOSE` to a file, so [`Sshd::connections`] counts the
//! TCP connections that reached it (`Connection from … on ADDR port P`), per port.
#![allow(dead_code)]

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where Debian's `openssh-server` installs the daemon (`.ci/prereqs` installs it).
pub const SSHD: &str = "/usr/sbin/sshd";

/// True when `sshd`, `ssh` and `ssh-keygen` are installed; missing in CI fails the test,
/// elsewhere a loud skip (like `support::have`).
pub fn have_openssh() -> bool {
    let found = [SSHD, "/usr/bin/ssh", "/usr/bin/ssh-keygen"].iter().all(|p| Path::new(p).exists());
    assert!(
        found || !crate::support::in_ci(),
        "prerequisite OpenSSH missing ({SSHD}, /usr/bin/ssh, /usr/bin/ssh-keygen; .ci/prereqs \
         installs openssh-server and openssh-client)"
    );
    if !found {
        eprintln!("SKIP: OpenSSH (server and client) not installed");
    }
    found
}

pub struct Sshd {
    child: Child,
    /// The loopback address it listens on.
    pub ip: Ipv4Addr,
    /// The ports it listens on: `[22, high]` as root, two high ports otherwise.
    pub ports: [u16; 2],
    /// The user it authenticates (the user the tests run as).
    pub user: String,
    /// The authorised client key's private half (mode 0600, owned by the test's user).
    pub client_key: PathBuf,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

fn run_ok(cmd: &mut Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A free high port on `ip` right now (the kernel's pick; sshd binds it moments later, and a
/// lost race shows up as sshd's bind failure, which [`Sshd::start`] retries).
fn free_port(ip: Ipv4Addr) -> Option<u16> {
    TcpListener::bind((ip, 0)).ok()?.local_addr().ok().map(|a| a.port())
}

impl Sshd {
    /// Starts a server whose client key is written to `client_key` (a path the sandbox can
    /// read, e.g. inside the repo). Panics (with sshd's log) if no server comes up.
    pub fn start(client_key: &Path) -> Self {
        let root = nix::unistd::geteuid().is_root();
        let user = nix::unistd::User::from_uid(nix::unistd::geteuid())
            .ok()
            .flatten()
            .map(|u| u.name)
            .expect("the test user has a passwd entry (sshd authenticates it)");
        if root {
            // sshd (privilege separation, run as root) refuses to start without its empty,
            // root-owned chroot directory; Debian makes it at boot through tmpfiles/systemd,
            // which these machines do not run. The same directory the package expects.
            std::fs::create_dir_all("/run/sshd").expect("creating /run/sshd for sshd");
        }
        let dir = tempfile::Builder::new().prefix("airlock-sshd-").tempdir().unwrap();
        let host_key = dir.path().join("host_ed25519");
        let keygen = |path: &Path| {
            run_ok(
                Command::new("/usr/bin/ssh-keygen")
                    .args(["-q", "-t", "ed25519", "-N", "", "-C", "airlock-test", "-f"])
                    .arg(path)
                    .stdin(Stdio::null()),
                "ssh-keygen",
            );
        };
        keygen(&host_key);
        let _ = std::fs::remove_file(client_key);
        let _ = std::fs::remove_file(client_key.with_extension("pub"));
        keygen(client_key);
        let authorized = dir.path().join("authorized_keys");
        let mut public = client_key.as_os_str().to_owned();
        public.push(".pub");
        std::fs::copy(&public, &authorized).unwrap();

        // Addresses 127.0.0.100–199, starting at one picked by pid, so parallel tests and other
        // checkouts rarely meet; a taken address/port is a bind failure and the next is tried.
        let first = 100 + (std::process::id() % 100) as u8;
        let mut failures = String::new();
        for attempt in 0..20u8 {
            let ip = Ipv4Addr::new(127, 0, 0, 100 + (first - 100 + attempt * 7) % 100);
            let Some(high) = free_port(ip) else { continue };
            let other = if root {
                22
            } else {
                match free_port(ip) {
                    Some(p) if p != high => p,
                    _ => continue,
                }
            };
            let ports = if root { [22, high] } else { [other, high] };
            match Self::spawn(dir.path(), &host_key, &authorized, ip, ports) {
                Ok((child, log)) => {
                    return Self {
                        child,
                        ip,
                        ports,
                        user,
                        client_key: client_key.to_path_buf(),
                        log,
                        _dir: dir,
                    };
                }
                Err(why) => failures.push_str(&format!("--- {ip} {ports:?}\n{why}\n")),
            }
        }
        panic!("no test sshd came up on 127.0.0.100-199:\n{failures}");
    }

    /// One attempt: config, `sshd -D -e -f CONFIG`, wait until it listens on both ports (or
    /// exits, e.g. because the address was taken: `Err` with its log).
    fn spawn(
        dir: &Path,
        host_key: &Path,
        authorized: &Path,
        ip: Ipv4Addr,
        ports: [u16; 2],
    ) -> Result<(Child, PathBuf), String> {
        let tag = format!("{ip}-{}", ports[1]);
        let config = dir.join(format!("sshd_config-{tag}"));
        let pid_file = dir.join(format!("sshd-{tag}.pid"));
        let log = dir.join(format!("sshd-{tag}.log"));
        // sshd_config(5). Only public-key authentication, of the one key; no PAM (it would
        // need the system's PAM stack and, unprivileged, cannot switch users anyway);
        // StrictModes off because the test files live in world-writable temp directories.
        let text = format!(
            "ListenAddress {ip}:{p0}\n\
             ListenAddress {ip}:{p1}\n\
             HostKey {host_key}\n\
             PidFile {pid}\n\
             AuthorizedKeysFile {authorized}\n\
             UsePAM no\n\
             StrictModes no\n\
             PubkeyAuthentication yes\n\
             PasswordAuthentication no\n\
             KbdInteractiveAuthentication no\n\
             PermitRootLogin prohibit-password\n\
             LogLevel VERBOSE\n",
            p0 = ports[0],
            p1 = ports[1],
            host_key = host_key.display(),
            pid = pid_file.display(),
            authorized = authorized.display(),
        );
        std::fs::write(&config, text).unwrap();
        let stderr = std::fs::File::create(&log).unwrap();
        // sshd re-executes itself by absolute path (sshd(8): "sshd re-execution requires
        // execution with an absolute path").
        let mut child = Command::new(SSHD)
            .arg("-D")
            .arg("-e")
            .arg("-f")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("cannot start {SSHD}: {e}"))?;
        let listening = |p: u16| format!("Server listening on {ip} port {p}.");
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if ports.iter().all(|&p| text.contains(&listening(p))) {
                return Ok((child, log));
            }
            // sshd keeps running when only some of its ListenAddresses bind; one taken port
            // is a failed attempt here.
            if text.contains("Bind to port") {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("sshd could not bind:\n{text}"));
            }
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("sshd exited ({status}):\n{text}"));
            }
            if Instant::now() > end {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("sshd did not listen within 20 s:\n{text}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Everything sshd logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// How many TCP connections reached it on `port` (sshd logs each at `VERBOSE`:
    /// `Connection from A port P on ADDR port PORT`).
    pub fn connections(&self, port: u16) -> usize {
        let needle = format!(" on {} port {port}", self.ip);
        self.log()
            .lines()
            .filter(|l| l.starts_with("Connection from ") && l.contains(&needle))
            .count()
    }

    /// The `ssh` options every test uses: this client key only, no host-key prompt or
    /// known_hosts write, no interactive prompt, a bounded connect.
    pub fn ssh_options(&self, key_inside: &str) -> String {
        format!(
            "-i {key_inside} -o IdentitiesOnly=yes -o StrictHostKeyChecking=no \
             -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o ConnectTimeout=10 -o LogLevel=ERROR"
        )
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        // Our own child, by pid; its per-connection children exit with their connections.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
