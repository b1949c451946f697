//! sd_notify(3) messages to the service manager: `READY=1` once the socket is adopted,
//! `STATUS=` with sessions and tunnels, `STOPPING=1` when draining starts. Without
//! `NOTIFY_SOCKET` (launchd, plain runs) every call is a no-op.

use sd_notify::NotifyState;

pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

pub fn status(status: &str) {
    send(&[NotifyState::Status(status)]);
}

pub fn stopping(status: &str) {
    send(&[NotifyState::Stopping, NotifyState::Status(status)]);
}

fn send(states: &[NotifyState<'_>]) {
    if let Err(err) = sd_notify::notify(states) {
        // The service manager going away is not a reason to stop serving.
        tracing::debug!("sd_notify failed: {err}");
    }
}

/// The `STATUS=` line.
pub fn describe(sessions: usize, tunnels: u64) -> String {
    let s = if sessions == 1 { "" } else { "s" };
    let t = if tunnels == 1 { "" } else { "s" };
    format!("{sessions} session{s}, {tunnels} tunnel{t}")
}
