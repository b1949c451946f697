//! An in-repo activation harness that behaves like systemd's socket units for `airlockd`: it
//! owns the listening socket, starts the daemon with it as fd 3 (`LISTEN_FDS=1`,
//! `LISTEN_FDNAMES`, `LISTEN_PID` = the child), starts the next instance whenever the socket
//! turns readable while no instance runs, and receives `NOTIFY_SOCKET` datagrams.
#![allow(dead_code)]

use std::ffi::OsString;
use std::os::fd::AsFd;
use std::os::unix::net::{UnixDatagram, UnixListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::Pid;

use airlock::sys::spawn::{ActivatedSpawn, Mode, spawn_activated};

use crate::support::{World, bin};

#[derive(Default)]
struct State {
    activations: usize,
    /// Exit codes of finished instances (128+N for a signal N).
    exits: Vec<i32>,
    current: Option<i32>,
    /// Extra variables for the next activations.
    env: Vec<(OsString, OsString)>,
}

pub struct Harness {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    notify: Arc<UnixDatagram>,
    notes: Arc<Mutex<Vec<String>>>,
    state: Arc<(Mutex<State>, Condvar)>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

pub struct Options<'a> {
    pub args: Vec<String>,
    pub fd_name: &'a str,
    pub env: Vec<(String, OsString)>,
    /// Mode of the socket directory and socket (0700/0600 normally; 0777 for the uid test).
    pub open_to_all: bool,
}

impl Default for Options<'_> {
    fn default() -> Self {
        Self {
            args: vec!["--idle-timeout".into(), "30s".into()],
            fd_name: "airlock",
            env: Vec::new(),
            open_to_all: false,
        }
    }
}

impl Harness {
    pub fn start(world: &World, opts: Options<'_>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        use std::os::unix::fs::PermissionsExt;
        let dir_mode = if opts.open_to_all { 0o777 } else { 0o700 };
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(dir_mode)).unwrap();
        let socket = dir.path().join("airlock.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let mode = if opts.open_to_all { 0o777 } else { 0o600 };
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(mode)).unwrap();
        let notify_path = dir.path().join("notify");
        let notify = Arc::new(UnixDatagram::bind(&notify_path).unwrap());
        notify.set_nonblocking(true).unwrap();
        let notes: Arc<Mutex<Vec<String>>> = Arc::default();

        let mut env: Vec<(OsString, OsString)> = vec![
            ("HOME".into(), world.home.clone().into()),
            ("PATH".into(), std::env::var_os("PATH").unwrap_or_default()),
            ("AIRLOCK_TEST_MANAGED_POLICY".into(), world.managed.clone().into()),
            ("NOTIFY_SOCKET".into(), notify_path.into()),
        ];
        env.extend(opts.env.into_iter().map(|(k, v)| (k.into(), v)));
        let args: Vec<OsString> = opts.args.into_iter().map(OsString::from).collect();
        let fd_name = opts.fd_name.to_owned();
        let state: Arc<(Mutex<State>, Condvar)> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp) = (Arc::clone(&state), Arc::clone(&stop));
        let log = std::fs::File::create(dir.path().join("airlockd.log")).unwrap();
        let (drain_socket, drain_notes) = (Arc::clone(&notify), Arc::clone(&notes));
        let thread = std::thread::spawn(move || {
            let program = bin("airlockd");
            while !sp.load(Ordering::SeqCst) {
                // Like systemd, read notifications continuously: the socket's queue is small
                // (net.unix.max_dgram_qlen), and a full queue would stall or drop messages.
                drain(&drain_socket, &drain_notes);
                // Like systemd: start an instance when the socket is readable and none runs.
                let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
                match poll(&mut fds, PollTimeout::from(20u16)) {
                    Ok(n) if n > 0 => {}
                    _ => continue,
                }
                // Later settings replace earlier ones (execve keeps duplicates; getenv takes the
                // first).
                let extra = st.0.lock().unwrap().env.clone();
                let mut full_env: Vec<(OsString, OsString)> = env
                    .iter()
                    .filter(|(k, _)| !extra.iter().any(|(x, _)| x == k))
                    .cloned()
                    .collect();
                let mut seen = Vec::new();
                for (k, v) in extra.into_iter().rev() {
                    if !seen.contains(&k) {
                        seen.push(k.clone());
                        full_env.push((k, v));
                    }
                }
                let pid = spawn_activated(&ActivatedSpawn {
                    program: &program,
                    args: &args,
                    env: &full_env,
                    listener: listener.as_fd(),
                    fd_name: &fd_name,
                    stderr: Some(log.as_fd()),
                    mode: Mode::Attached,
                })
                .unwrap()
                .unwrap();
                {
                    let mut s = st.0.lock().unwrap();
                    s.activations += 1;
                    s.current = Some(pid);
                    st.1.notify_all();
                }
                let code = loop {
                    match waitpid(Pid::from_raw(pid), None) {
                        Ok(WaitStatus::Exited(_, c)) => break c,
                        Ok(WaitStatus::Signaled(_, sig, _)) => break 128 + sig as i32,
                        Ok(_) | Err(nix::Error::EINTR) => continue,
                        Err(e) => panic!("waitpid: {e}"),
                    }
                };
                let mut s = st.0.lock().unwrap();
                s.exits.push(code);
                s.current = None;
                st.1.notify_all();
            }
        });
        Self { dir, socket, notify, notes, state, stop, thread: Some(thread) }
    }

    /// Adds a variable to the environment of the next instances.
    pub fn set_env(&self, key: &str, value: &str) {
        self.state.0.lock().unwrap().env.push((key.into(), value.into()));
    }

    /// Every notification received so far (drains the socket first).
    pub fn notifications(&self) -> Vec<String> {
        drain(&self.notify, &self.notes);
        self.notes.lock().unwrap().clone()
    }

    /// Waits (up to `timeout`) until `pred` holds for any notification.
    pub fn wait_notification(&self, timeout: Duration, pred: impl Fn(&str) -> bool) -> bool {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if self.notifications().iter().any(|n| pred(n)) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    pub fn activations(&self) -> usize {
        self.state.0.lock().unwrap().activations
    }

    pub fn exits(&self) -> Vec<i32> {
        self.state.0.lock().unwrap().exits.clone()
    }

    pub fn current_pid(&self) -> Option<i32> {
        self.state.0.lock().unwrap().current
    }

    /// Waits until `n` instances have exited; returns their exit codes.
    pub fn wait_exits(&self, n: usize, timeout: Duration) -> Vec<i32> {
        let (lock, cv) = &*self.state;
        let guard = lock.lock().unwrap();
        let (guard, _) = cv.wait_timeout_while(guard, timeout, |s| s.exits.len() < n).unwrap();
        assert!(
            guard.exits.len() >= n,
            "expected {n} exits, saw {:?}\n{}",
            guard.exits,
            self.log()
        );
        guard.exits.clone()
    }

    /// Waits until an instance runs; returns its pid.
    pub fn wait_running(&self, timeout: Duration) -> i32 {
        let (lock, cv) = &*self.state;
        let guard = lock.lock().unwrap();
        let (guard, _) = cv.wait_timeout_while(guard, timeout, |s| s.current.is_none()).unwrap();
        guard.current.expect("no airlockd instance started")
    }

    pub fn signal(&self, sig: Signal) {
        if let Some(pid) = self.current_pid() {
            let _ = kill(Pid::from_raw(pid), sig);
        }
    }

    /// The daemons' stderr.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("airlockd.log")).unwrap_or_default()
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            // The thread may be starting one more instance; kill until it has stopped.
            while !t.is_finished() {
                self.signal(Signal::SIGKILL);
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = t.join();
        }
    }
}

/// Moves every pending notification datagram into `notes`.
fn drain(socket: &UnixDatagram, notes: &Mutex<Vec<String>>) {
    let mut notes = notes.lock().unwrap();
    let mut buf = [0u8; 4096];
    while let Ok(n) = socket.recv(&mut buf) {
        notes.extend(String::from_utf8_lossy(&buf[..n]).lines().map(str::to_owned));
    }
}
