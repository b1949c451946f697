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
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    if let Err(err) = send_nonblocking(&path, states) {
        // The service manager going away, or its queue being full, is not a reason to stop
        // serving.
        tracing::debug!("sd_notify failed: {err}");
    }
}

/// Like `sd_notify::notify`, but never blocks: these calls run on the async runtime, and a
/// manager that stops draining its socket (whose queue is only `net.unix.max_dgram_qlen`
/// datagrams deep) must not stall the daemon. Supports path and abstract (`@name`) sockets
/// (sd_notify(3)).
fn send_nonblocking(path: &std::ffi::OsStr, states: &[NotifyState<'_>]) -> std::io::Result<()> {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};

    let msg: String = states.iter().map(|s| format!("{s}\n")).collect();
    let bytes = path.as_bytes();
    let addr = match bytes.strip_prefix(b"@") {
        Some(name) => SocketAddr::from_abstract_name(name)?,
        None => SocketAddr::from_pathname(std::path::Path::new(path))?,
    };
    let socket = UnixDatagram::unbound()?;
    socket.set_nonblocking(true)?;
    let sent = socket.send_to_addr(msg.as_bytes(), &addr)?;
    if sent == msg.len() {
        Ok(())
    } else {
        Err(std::io::Error::new(std::io::ErrorKind::WriteZero, "incomplete notify datagram"))
    }
}

/// The `STATUS=` line.
pub fn describe(sessions: usize, tunnels: u64) -> String {
    let s = if sessions == 1 { "" } else { "s" };
    let t = if tunnels == 1 { "" } else { "s" };
    format!("{sessions} session{s}, {tunnels} tunnel{t}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: a manager that never drains its socket stalled the daemon on the 6th
    /// session (the queue holds `max_dgram_qlen` = 10 datagrams); sends must fail, not block.
    #[test]
    fn a_full_notify_queue_never_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let manager = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        let mut failed = 0;
        for _ in 0..200 {
            if send_nonblocking(path.as_os_str(), &[NotifyState::Status("x")]).is_err() {
                failed += 1;
            }
        }
        assert!(failed > 0, "the queue never filled");
        let mut buf = [0u8; 64];
        let n = manager.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STATUS=x\n");
    }
}
