//! Change notices for the host's interface addresses: an rtnetlink socket (`NETLINK_ROUTE`)
//! bound to the multicast groups `RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR`, on which the
//! kernel announces every `RTM_NEWADDR` / `RTM_DELADDR` of the network namespace the socket
//! was made in (rtnetlink(7), netlink(7)). The caller only needs to know *that* an address
//! changed — it re-reads the whole set with getifaddrs(3) — so messages are classified, not
//! decoded.
//!
//! nix's safe socket calls only: no `unsafe`.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, socket,
};

/// `struct nlmsghdr` is 16 bytes: len (u32), type (u16), flags (u16), seq (u32), pid (u32).
const NLMSG_HDRLEN: usize = 16;
/// netlink(7): the kernel's buffer for this socket overflowed and notices were dropped.
const NLMSG_OVERRUN: u16 = 4;
/// netlink(7): an error or acknowledgement.
const NLMSG_ERROR: u16 = 2;
/// Big enough for any burst of address notices the kernel sends in one datagram.
const RECV_BUF: usize = 32 * 1024;

/// What one read of the socket said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notice {
    /// An address was added or removed, or notices were lost (re-read to be safe).
    Changed,
    /// Only messages that do not concern addresses.
    Other,
    /// Nothing arrived within the wait.
    Quiet,
}

/// Whether a datagram from the socket announces an address change: any `RTM_NEWADDR` or
/// `RTM_DELADDR`, or an overrun / error message (something may have been lost). A header that
/// runs past the buffer ends the walk (`NLMSG_OK`); what was seen up to there counts.
pub fn classify(buf: &[u8]) -> Notice {
    let mut off = 0;
    let mut seen = Notice::Other;
    while off + NLMSG_HDRLEN <= buf.len() {
        let len = u32::from_ne_bytes([buf[off], buf[off + 1], buf[off + 2], buf[off + 3]]) as usize;
        let ty = u16::from_ne_bytes([buf[off + 4], buf[off + 5]]);
        if len < NLMSG_HDRLEN || off + len > buf.len() {
            break;
        }
        if matches!(ty, libc::RTM_NEWADDR | libc::RTM_DELADDR | NLMSG_OVERRUN | NLMSG_ERROR) {
            seen = Notice::Changed;
        }
        // NLMSG_ALIGN: messages start on 4-byte boundaries.
        off += (len + 3) & !3;
    }
    seen
}

/// A subscribed rtnetlink socket (see the module header).
#[derive(Debug)]
pub struct AddrNotices {
    fd: OwnedFd,
    buf: Vec<u8>,
}

impl AddrNotices {
    /// Subscribes in the calling thread's network namespace.
    pub fn open() -> io::Result<Self> {
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkRoute,
        )?;
        // The bitmask form of the groups (rtnetlink(7)); port id 0 lets the kernel choose.
        let groups = (libc::RTMGRP_IPV4_IFADDR | libc::RTMGRP_IPV6_IFADDR) as u32;
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, groups))?;
        Ok(Self { fd, buf: vec![0u8; RECV_BUF] })
    }

    /// Waits for the next datagram, at most `timeout` (`None`: for ever). `ENOBUFS` means the
    /// kernel dropped notices for us (netlink(7)): that is a change too.
    pub fn next(&mut self, timeout: Option<Duration>) -> io::Result<Notice> {
        let wait = match timeout {
            None => PollTimeout::NONE,
            Some(t) => PollTimeout::try_from(t).unwrap_or(PollTimeout::MAX),
        };
        let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, wait) {
            Ok(0) => return Ok(Notice::Quiet),
            Ok(_) => {}
            Err(Errno::EINTR) => return Ok(Notice::Other),
            Err(e) => return Err(e.into()),
        }
        match recv(self.fd.as_raw_fd(), &mut self.buf, MsgFlags::MSG_DONTWAIT) {
            Ok(n) => Ok(classify(&self.buf[..n])),
            Err(Errno::ENOBUFS) => Ok(Notice::Changed),
            Err(Errno::EAGAIN | Errno::EINTR) => Ok(Notice::Other),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// One netlink message of type `ty` with `payload` bytes after the header.
    fn msg(ty: u16, payload: usize) -> Vec<u8> {
        let len = NLMSG_HDRLEN + payload;
        let mut m = Vec::new();
        m.extend((len as u32).to_ne_bytes());
        m.extend(ty.to_ne_bytes());
        m.extend(0u16.to_ne_bytes());
        m.extend(0u32.to_ne_bytes());
        m.extend(0u32.to_ne_bytes());
        m.resize(len, 0xAA);
        m.resize((len + 3) & !3, 0);
        m
    }

    #[test]
    fn address_messages_are_changes_and_others_are_not() {
        assert_eq!(classify(&msg(libc::RTM_NEWADDR, 40)), Notice::Changed);
        assert_eq!(classify(&msg(libc::RTM_DELADDR, 40)), Notice::Changed);
        assert_eq!(classify(&msg(libc::RTM_NEWLINK, 40)), Notice::Other);
        assert_eq!(classify(&msg(libc::RTM_NEWROUTE, 40)), Notice::Other);
        // Lost notices or an error: re-read to be safe.
        assert_eq!(classify(&msg(NLMSG_OVERRUN, 0)), Notice::Changed);
        assert_eq!(classify(&msg(NLMSG_ERROR, 20)), Notice::Changed);
        assert_eq!(classify(&[]), Notice::Other);
    }

    #[test]
    fn every_message_of_a_datagram_is_looked_at_with_alignment() {
        // An unaligned payload (37 bytes) before the address message: the walk must round up.
        let mut buf = msg(libc::RTM_NEWLINK, 37);
        buf.extend(msg(libc::RTM_NEWROUTE, 3));
        buf.extend(msg(libc::RTM_DELADDR, 41));
        assert_eq!(classify(&buf), Notice::Changed);
    }

    #[test]
    fn truncated_or_bogus_headers_end_the_walk_without_panicking() {
        let full = msg(libc::RTM_NEWADDR, 40);
        for cut in 0..full.len() {
            assert_eq!(classify(&full[..cut]), Notice::Other, "cut at {cut}");
        }
        // A length shorter than the header would loop for ever without the check.
        let mut bogus = msg(libc::RTM_NEWLINK, 0);
        bogus[..4].copy_from_slice(&3u32.to_ne_bytes());
        bogus.extend(msg(libc::RTM_NEWADDR, 8));
        assert_eq!(classify(&bogus), Notice::Other);
        // What was seen before a bad header still counts.
        let mut seen = msg(libc::RTM_NEWADDR, 8);
        seen.extend([0xFF; 7]);
        assert_eq!(classify(&seen), Notice::Changed);
    }

    #[test]
    fn the_socket_opens_and_waits_quietly() {
        // Subscribing needs no privilege; nothing changes here within a millisecond or two,
        // and if something did the answer is still one of the three.
        let mut n = AddrNotices::open().unwrap();
        let got = n.next(Some(Duration::from_millis(1))).unwrap();
        assert!(matches!(got, Notice::Quiet | Notice::Changed | Notice::Other));
    }
}
