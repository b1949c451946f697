//! UDP refusals (issue 14): every UDP datagram from inside the sandbox to a non-loopback
//! address is dropped there by the sandbox's nftables rule, which answers ICMP port
//! unreachable and reports the datagram on the netfilter log socket made inside
//! ([`crate::sys::nflog`]) and handed over as `capture_udp_log`. This module reads that socket
//! and writes one audit line per datagram through the session's audit sink — so the per-session
//! rate limit of identical refusals (`audit::volume`) bounds a flood, with exact counts.
//!
//! The line names the destination: `method: "UDP"`, `host` = the name a synthetic address of
//! the session stands for (else the IP), `port`, `allowed: false`, `"capture": "transparent"`,
//! `reason: "udp_refused"`, `layer: "none"`. Nothing is decided here and nothing is sent: the
//! refusal already happened in the kernel, and only TCP leaves the sandbox (QUIC clients fall
//! back to TCP, which is captured); DNS goes to the sandbox's resolver at 127.0.0.53, which
//! the rule leaves alone (loopback).
//!
//! What arrives is parsed as untrusted bytes; only messages from the kernel (netlink port id 0)
//! are read. A message the kernel dropped because the socket's receive buffer was full is a
//! gap in the log instance's sequence numbers (`NFULA_SEQ`): counted in the daemon's log as
//! a warning, since the datagram's destination is unknown (the datagram itself was refused
//! all the same).

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use nix::errno::Errno;
use nix::sys::socket::{NetlinkAddr, recvfrom, setsockopt, sockopt};
use tokio::sync::watch;

use crate::audit::{AuditLine, Capture};
use crate::policy::{Host, LayerKind, Reason};
use crate::sys::nflog::{self, Logged};

use super::synthetic::MapBack;
use super::{SessionProxy, respond};

/// Serves a session's handed-over log socket (if its sandbox sent one) in the background until
/// `shutdown`; the daemon's session start calls this. `None` in, `None` out.
pub fn serve_in_background(
    log: Option<OwnedFd>,
    session: &Arc<SessionProxy>,
    shutdown: &watch::Receiver<bool>,
) -> Option<tokio::task::JoinHandle<()>> {
    let log = log?;
    let (s, rx) = (Arc::clone(session), shutdown.clone());
    Some(tokio::spawn(async move {
        if let Err(e) = serve(log, s, rx).await {
            // The datagrams are still refused inside; only their lines are missing from here.
            tracing::error!("UDP refusal log of the session stopped: {e}");
        }
    }))
}

/// Reads the log socket until `shutdown`, one audit line per reported datagram.
pub async fn serve(
    log: OwnedFd,
    session: Arc<SessionProxy>,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let flags = OFlag::from_bits_truncate(fcntl(&log, FcntlArg::F_GETFL)?);
    fcntl(&log, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    // socket(7): SO_RCVBUFFORCE may exceed net.core.rmem_max but needs CAP_NET_ADMIN in the
    // initial namespace, so only a root daemon gets it; the sandbox already asked for
    // LOG_RCVBUF within the cap. A lost report still shows as a gap (below).
    if let Err(e) = setsockopt(&log, sockopt::RcvBufForce, &nflog::LOG_RCVBUF) {
        tracing::debug!("SO_RCVBUFFORCE on the UDP refusal log: {e}");
    }
    let fd = nflog::into_async(log)?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut gaps = Gaps::default();
    loop {
        tokio::select! {
            biased;
            () = super::stopped(&mut shutdown) => {
                // Session end: what the kernel still holds was refused before the sandbox
                // ended; report it, then write the pending summaries, so no count is lost.
                read_all(fd.get_ref().as_raw_fd(), &mut buf, &session, &mut gaps)?;
                let audit = Arc::clone(&session.audit);
                match tokio::task::spawn_blocking(move || audit.flush()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::error!("UDP refusal log: cannot write summaries: {e}"),
                    Err(e) => tracing::error!("UDP refusal log: summary flush failed: {e}"),
                }
                return Ok(());
            }
            ready = fd.readable() => {
                let mut guard = ready?;
                read_all(fd.get_ref().as_raw_fd(), &mut buf, &session, &mut gaps)?;
                guard.clear_ready();
            }
        }
    }
}

/// Reads and reports every message the (non-blocking) log socket holds, until `EAGAIN`.
fn read_all(
    fd: std::os::fd::RawFd,
    buf: &mut [u8],
    session: &SessionProxy,
    gaps: &mut Gaps,
) -> std::io::Result<()> {
    loop {
        match recvfrom::<NetlinkAddr>(fd, buf) {
            Ok((n, from)) => {
                // Only the kernel reports packets; anything else is not ours to believe (the
                // sandbox cannot make netlink sockets: seccomp).
                if from.is_none_or(|a| a.pid() != 0) {
                    tracing::warn!("UDP refusal log: ignored a message not from the kernel");
                    continue;
                }
                report(session, &buf[..n], gaps);
            }
            Err(Errno::EAGAIN) => return Ok(()),
            Err(Errno::EINTR) => continue,
            Err(Errno::ENOBUFS) => {
                tracing::warn!(
                    "UDP refusal log: the kernel dropped reports (receive buffer full); the \
                     next report's sequence number counts them"
                );
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Counts reports missing from the log instance's sequence (`NFULA_SEQ`), from the first
/// report this daemon instance reads: a re-registered session's socket (the supervisor kept a
/// copy while the daemon restarted) continues where the previous instance stopped reading.
#[derive(Debug, Default)]
pub struct Gaps {
    next: Option<u32>,
    /// Reports the kernel dropped so far.
    pub lost: u64,
}

impl Gaps {
    /// Notes report `seq`; returns how many were missing just before it.
    pub fn note(&mut self, seq: u32) -> u32 {
        let missing = seq.wrapping_sub(self.next.unwrap_or(seq));
        // A sequence number behind the expected one (reordering cannot happen on one netlink
        // socket) is treated as no gap rather than as four billion lost.
        let missing = if missing > u32::MAX / 2 { 0 } else { missing };
        self.next = Some(seq.wrapping_add(1));
        self.lost += u64::from(missing);
        missing
    }
}

/// Audits every datagram of one message from the log socket.
fn report(session: &SessionProxy, msg: &[u8], gaps: &mut Gaps) {
    for got in nflog::parse(msg) {
        match got {
            Ok(Logged { seq, dst, .. }) => {
                if let Some(seq) = seq {
                    let missing = gaps.note(seq);
                    if missing > 0 {
                        tracing::warn!(
                            "UDP refusal log: {missing} refused datagrams were not reported by \
                             the kernel (receive buffer full; {} so far this session)",
                            gaps.lost
                        );
                    }
                }
                let line = line_for(session, dst);
                if let Err(e) = session.audit.append(&line) {
                    tracing::error!("cannot write the audit line of refused UDP to {dst}: {e}");
                }
            }
            Err(e) => tracing::warn!("UDP refusal log: unreadable report: {e}"),
        }
    }
}

/// The audit line of one refused datagram to `dst`.
pub fn line_for(session: &SessionProxy, dst: SocketAddr) -> AuditLine {
    // An IPv4-mapped IPv6 destination is the IPv4 address (as in transparent capture).
    let ip = match dst.ip() {
        std::net::IpAddr::V6(v6) => {
            v6.to_ipv4_mapped().map_or(std::net::IpAddr::V6(v6), Into::into)
        }
        v4 => v4,
    };
    let host = match session.synthetic.map_back(Host::Ip(ip)) {
        MapBack::Name { name, .. } => name.to_string(),
        MapBack::Unchanged(h) => h.to_string(),
        // In the synthetic range but not this session's: the address as it was.
        MapBack::Foreign(a) => a.to_string(),
    };
    let mut line = respond::new_line(session, &host, Some(dst.port()), "UDP");
    line.capture = Some(Capture::Transparent);
    line.reason = Some(Reason::UdpRefused);
    line.layer = Some(LayerKind::None);
    line.duration_ms = Some(0);
    line
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn gaps_count_exactly_what_the_kernel_dropped() {
        let mut g = Gaps::default();
        // The first report read sets the base.
        assert_eq!(g.note(0), 0);
        assert_eq!(g.note(1), 0);
        assert_eq!(g.note(5), 3);
        assert_eq!(g.note(6), 0);
        assert_eq!(g.lost, 3);
        // Behind the expected number: no gap.
        assert_eq!(g.note(2), 0);
        // Wrapping at u32::MAX.
        let mut w = Gaps { next: Some(u32::MAX), lost: 0 };
        assert_eq!(w.note(1), 2);
        // A daemon reading a re-registered socket starts wherever the kernel is.
        let mut r = Gaps::default();
        assert_eq!((r.note(9000), r.note(9001), r.lost), (0, 0, 0));
    }
}
