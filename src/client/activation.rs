//! Who answers a dead socket (DESIGN §6): a service manager's unit or LaunchAgent ("service
//! down" with the fix), or the CLI's one-shot activator, which binds the socket under a lock and
//! starts `airlockd` with it.

use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use super::socket::ensure_dir;
use super::{ClientError, Endpoint, LAUNCHD_LABEL, SocketPath, SocketSource};
use crate::env::Env;
use crate::sys::{activation::SOCKET_NAME, spawn};

/// How a dead socket is handled, decided once per endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Activation {
    /// No service manager owns this path: the CLI starts `airlockd` itself.
    OneShot,
    /// A unit or LaunchAgent owns it (found at the path given): a dead socket is "service down".
    ServiceManager { unit: PathBuf },
}

/// Where a unit or LaunchAgent for the control socket would be installed, most specific first.
pub fn service_unit_candidates(env: &dyn Env) -> Vec<PathBuf> {
    let home = env.var("HOME").map(PathBuf::from);
    if cfg!(target_os = "macos") {
        let mut v: Vec<PathBuf> = home
            .iter()
            .map(|h| h.join("Library/LaunchAgents").join(format!("{LAUNCHD_LABEL}.plist")))
            .collect();
        v.push(PathBuf::from(format!("/Library/LaunchAgents/{LAUNCHD_LABEL}.plist")));
        v
    } else {
        let config = env
            .var("XDG_CONFIG_HOME")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .or_else(|| home.map(|h| h.join(".config")));
        let mut v: Vec<PathBuf> =
            config.iter().map(|c| c.join("systemd/user/airlock.socket")).collect();
        for d in ["/etc/systemd/user", "/usr/local/lib/systemd/user", "/usr/lib/systemd/user"] {
            v.push(Path::new(d).join("airlock.socket"));
        }
        v
    }
}

/// The fix printed when a managed socket is dead: each command in its own backticks, so the
/// message reads `Start it with `cmd` (check `cmd`)`, never nested quotes.
pub fn service_fix() -> String {
    if cfg!(target_os = "macos") {
        format!(
            "`launchctl bootstrap gui/$(id -u) ~/Library/LaunchAgents/{LAUNCHD_LABEL}.plist` \
             (or `airlock service install`)"
        )
    } else {
        "`systemctl --user enable --now airlock.socket` (check `systemctl --user status \
         airlock.socket airlock.service`)"
            .to_owned()
    }
}

/// The DESIGN §6 decision: one-shot activation applies for the `/tmp` fallback, and for
/// `$AIRLOCK_SOCKET`/`$XDG_RUNTIME_DIR` paths no installed unit or LaunchAgent serves.
pub fn decide_activation(env: &dyn Env, socket: &SocketPath) -> Activation {
    if socket.source == SocketSource::TmpFallback {
        return Activation::OneShot;
    }
    let Some(unit) = service_unit_candidates(env).into_iter().find(|p| p.exists()) else {
        return Activation::OneShot;
    };
    let serves_path = match socket.source {
        SocketSource::XdgRuntime => true,
        // launchd's fleet plist exports its socket as $AIRLOCK_SOCKET (SecureSocketWithKey).
        SocketSource::Env if cfg!(target_os = "macos") => true,
        // systemd's unit listens on %t/airlock/airlock.sock only.
        SocketSource::Env => env
            .var("XDG_RUNTIME_DIR")
            .map(|d| Path::new(&d).join("airlock/airlock.sock") == socket.path)
            .unwrap_or(false),
        SocketSource::TmpFallback => false,
    };
    if serves_path { Activation::ServiceManager { unit } } else { Activation::OneShot }
}

/// Whether the service manager reports the daemon's service running, asked without touching
/// its socket (a connection would start it): `systemctl --user is-active airlock.service`, or
/// `launchctl print` of the LaunchAgent showing `state = running`. A manager that cannot be
/// asked counts as "not running": `status --no-start` must never be the one that starts it.
pub fn service_is_active() -> bool {
    let mut cmd = if cfg!(target_os = "macos") {
        let mut c = std::process::Command::new("launchctl");
        c.arg("print").arg(format!("gui/{}/{LAUNCHD_LABEL}", nix::unistd::getuid()));
        c
    } else {
        let mut c = std::process::Command::new("systemctl");
        c.args(["--user", "is-active", "airlock.service"]);
        c
    };
    cmd.stdin(std::process::Stdio::null()).stderr(std::process::Stdio::null());
    match cmd.output() {
        Ok(out) if cfg!(target_os = "macos") => {
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("state = running")
        }
        // `is-active` exits 0 only for an active unit.
        Ok(out) => out.status.success(),
        Err(_) => false,
    }
}

/// `airlockd` next to the running `airlock` binary first, then on `PATH`.
pub fn find_daemon() -> Option<PathBuf> {
    let beside =
        std::env::current_exe().ok().and_then(|exe| exe.parent().map(|d| d.join("airlockd")));
    if let Some(p) = beside.filter(|p| p.is_file()) {
        return Some(p);
    }
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path).map(|d| d.join("airlockd")).find(|p| p.is_file())
    })
}

impl Endpoint {
    /// The one-shot activator (DESIGN §6): under `flock` on `<dir>/airlock.lock`, only the lock
    /// holder unlinks a stale socket and binds; it starts `airlockd` with the socket as fd 3.
    pub(super) fn activate(&self) -> Result<(), ClientError> {
        let dir = self.socket.dir();
        ensure_dir(dir)?;
        let act =
            |what: &str, e: &dyn std::fmt::Display| ClientError::Activate(format!("{what}: {e}"));
        let lock_path = dir.join("airlock.lock");
        let lock_file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(&lock_path)
            .map_err(|e| act(&format!("cannot open {}", lock_path.display()), &e))?;
        let _lock = nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| act(&format!("cannot lock {}", lock_path.display()), &e))?;
        // Someone may have activated while we waited for the lock.
        match UnixStream::connect(&self.socket.path) {
            Ok(_) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
                // A stale socket file from a daemon that idled out; we hold the lock.
                let meta = std::fs::symlink_metadata(&self.socket.path)
                    .map_err(|e| act("cannot inspect the stale socket", &e))?;
                if !std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()) {
                    return Err(ClientError::Activate(format!(
                        "{} exists and is not a socket; remove it",
                        self.socket.path.display()
                    )));
                }
                std::fs::remove_file(&self.socket.path)
                    .map_err(|e| act("cannot remove the stale socket", &e))?;
            }
            Err(e) => {
                return Err(act(&format!("cannot connect to {}", self.socket.path.display()), &e));
            }
        }
        let listener = UnixListener::bind(&self.socket.path)
            .map_err(|e| act(&format!("cannot bind {}", self.socket.path.display()), &e))?;
        std::fs::set_permissions(&self.socket.path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| act("cannot chmod the socket", &e))?;
        let program = find_daemon().ok_or_else(|| {
            ClientError::Activate(
                "airlockd was found neither next to airlock nor on PATH; install both binaries \
                 side by side"
                    .into(),
            )
        })?;
        let log = self.daemon_log.as_ref().and_then(|p| {
            if let Some(parent) = p.parent() {
                let _ = std::fs::DirBuilder::new().recursive(true).mode(0o700).create(parent);
            }
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .custom_flags(libc::O_CLOEXEC)
                .open(p)
                .ok()
        });
        spawn::spawn_activated(&spawn::ActivatedSpawn {
            program: &program,
            args: &[],
            env: &self.daemon_env,
            listener: listener.as_fd(),
            fd_name: SOCKET_NAME,
            stderr: log.as_ref().map(AsFd::as_fd),
            mode: spawn::Mode::Detached,
        })
        .map_err(|e| act(&format!("cannot start {}", program.display()), &e))?;
        // Our copy closes here; the daemon holds the socket now.
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::env::MapEnv;

    #[test]
    fn activation_decision_follows_design() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().join("home");
        let run = tmp.path().join("run");
        let base = MapEnv::new().with("HOME", &home).with("XDG_RUNTIME_DIR", &run);
        let xdg = SocketPath::resolve(&base);
        let other = SocketPath { path: tmp.path().join("x.sock"), source: SocketSource::Env };
        let tmpfb = SocketPath {
            path: "/tmp/airlock-1/airlock.sock".into(),
            source: SocketSource::TmpFallback,
        };
        assert_eq!(decide_activation(&base, &xdg), Activation::OneShot);
        if cfg!(target_os = "linux") && !Path::new("/etc/systemd/user/airlock.socket").exists() {
            let unit = home.join(".config/systemd/user/airlock.socket");
            std::fs::create_dir_all(unit.parent().unwrap()).unwrap();
            std::fs::write(&unit, "").unwrap();
            assert_eq!(decide_activation(&base, &xdg), Activation::ServiceManager { unit });
            assert_eq!(decide_activation(&base, &other), Activation::OneShot);
            assert_eq!(decide_activation(&base, &tmpfb), Activation::OneShot);
            let same = SocketPath { path: xdg.path.clone(), source: SocketSource::Env };
            assert!(matches!(decide_activation(&base, &same), Activation::ServiceManager { .. }));
        }
    }
}
