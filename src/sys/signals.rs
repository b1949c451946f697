//! Holding the terminal's signals while a child CLI runs a session (the container backend's
//! engine CLI): SIGINT, SIGTERM, SIGHUP and SIGQUIT are blocked in this process and passed on
//! to the child, so this process outlives the session to clean up after it. No `unsafe` here:
//! blocking and waiting go through nix's safe wrappers and [`super::exec::sigtimedwait`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, pthread_sigmask};
use nix::unistd::Pid;

/// Passes the held signals on to one child until dropped; then discards what is still pending
/// and restores the signal mask. Create it before any other thread starts: a thread that does
/// not block these signals would take them with their default action (pthread_sigmask(3)).
#[derive(Debug)]
pub struct Forwarder {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    old: SigSet,
    set: SigSet,
}

fn held() -> SigSet {
    let mut set = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP, Signal::SIGQUIT] {
        set.add(s);
    }
    set
}

impl Forwarder {
    pub fn start(child: u32) -> Self {
        let set = held();
        let mut old = SigSet::empty();
        // Blocking cannot fail with a valid `how` and set; if it did, the signals keep their
        // default action, which is the behaviour without a forwarder.
        let _ = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), Some(&mut old));
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let pid = Pid::from_raw(child as i32);
        let thread = std::thread::Builder::new()
            .name("airlock-signals".into())
            .spawn(move || {
                while !flag.load(Ordering::Acquire) {
                    if let Ok(Some(sig)) =
                        super::exec::sigtimedwait(&set, Duration::from_millis(100))
                        && !flag.load(Ordering::Acquire)
                    {
                        // The child is ours and not yet reaped while `flag` is unset, so its
                        // pid cannot have been reused.
                        let _ = kill(pid, sig);
                    }
                }
            })
            .ok();
        Self { stop, thread, old, set }
    }
}

impl Drop for Forwarder {
    /// Called once the child has been waited for.
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
        // What arrived after the thread stopped was meant for the session, which is over.
        while let Ok(Some(_)) = super::exec::sigtimedwait(&self.set, Duration::ZERO) {}
        let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&self.old), None);
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
