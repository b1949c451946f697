//! Holding the terminal's signals for a whole container session: SIGINT, SIGTERM, SIGHUP and
//! SIGQUIT are blocked in this process from the session's start ([`Hold`]) to the end of its
//! cleanup, and passed on to the engine CLI while the sandbox runs ([`Forwarder`]), so this
//! process always lives to stop the proxy, sweep the repo and remove what the session made. No
//! `unsafe` here: blocking and waiting go through nix's safe wrappers and
//! [`super::exec::sigtimedwait`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, pthread_sigmask};
use nix::unistd::Pid;

/// The signals a session holds.
fn held() -> SigSet {
    let mut set = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP, Signal::SIGQUIT] {
        set.add(s);
    }
    set
}

/// Blocks the held signals on the calling thread until dropped; threads started meanwhile
/// inherit the block (pthread_sigmask(3)), so create it before any: a thread that does not
/// block them would take them with their default action and end the process mid-cleanup. On
/// drop, what is still pending is discarded (it was meant for the session, which is over) and
/// the mask is restored.
#[derive(Debug)]
pub struct Hold {
    old: SigSet,
    set: SigSet,
}

impl Hold {
    pub fn new() -> Self {
        let set = held();
        let mut old = SigSet::empty();
        // Blocking cannot fail with a valid `how` and set; if it did, the signals keep their
        // default action, which is the behaviour without a hold.
        let _ = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), Some(&mut old));
        Self { old, set }
    }
}

impl Default for Hold {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        while let Ok(Some(_)) = super::exec::sigtimedwait(&self.set, Duration::ZERO) {}
        let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&self.old), None);
    }
}

/// Passes the held signals on to one child until dropped. Needs a [`Hold`] in force (the
/// signals must be blocked for its wait to receive them).
#[derive(Debug)]
pub struct Forwarder {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Forwarder {
    pub fn start(_hold: &Hold, child: u32) -> Self {
        let set = held();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let pid = Pid::from_raw(child as i32);
        let thread = std::thread::Builder::new().name("airlock-signals".into()).spawn(move || {
            while !flag.load(Ordering::Acquire) {
                if let Ok(Some(sig)) = super::exec::sigtimedwait(&set, Duration::from_millis(100))
                    && !flag.load(Ordering::Acquire)
                {
                    // The child is ours and not yet reaped while `flag` is unset, so its
                    // pid cannot have been reused.
                    let _ = kill(pid, sig);
                }
            }
        });
        if let Err(e) = &thread {
            // The signals stay held: the session still ends and is cleaned up, but the
            // engine CLI is not told (it still gets the terminal's own signals).
            tracing::warn!(error = %e, "cannot start the signal forwarder");
        }
        Self { stop, thread: thread.ok() }
    }
}

impl Drop for Forwarder {
    /// Called once the child has exited (and before it is reaped).
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            // Wake it now rather than at its next timeout (up to 100 ms of every session's
            // end): a held signal sent to that thread alone ends its wait, and the flag says
            // not to pass it on.
            use std::os::unix::thread::JoinHandleExt;
            let _ = nix::sys::pthread::pthread_kill(t.as_pthread_t(), Signal::SIGHUP);
            let _ = t.join();
        }
    }
}

/// Waits until child `pid` has exited, leaving it unreaped (waitid(2) `WNOWAIT`): its pid
/// stays its own until the caller reaps it, so a [`Forwarder`] stopped in between never
/// signals a reused pid.
pub fn wait_exited_unreaped(pid: u32) {
    use nix::sys::wait::{Id, WaitPidFlag, waitid};
    loop {
        match waitid(
            Id::Pid(Pid::from_raw(pid as i32)),
            WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT,
        ) {
            Err(nix::errno::Errno::EINTR) => continue,
            _ => return,
        }
    }
}
