//! The host side of the sandbox's stdio: bytes between the caller's descriptors and the
//! sandbox's pipes or pty master, plus the supervisor's signals (signalfd). Descriptors the
//! caller owns are never made non-blocking (that would change them for the caller's shell
//! too): they are read only when poll(2) says so and written blocking. The pty master's output
//! to a terminal goes through a [`TermFilter`]; pipes are copied exactly.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::Signal;
use nix::sys::signalfd::SignalFd;

use super::termfilter::TermFilter;

/// One direction of bytes.
#[derive(Debug)]
pub struct Pump {
    /// Where bytes come from (an fd we own, or the caller's stdin).
    pub src: Endpoint,
    /// Where they go.
    pub dst: Endpoint,
    /// Input pumps stop when the sandbox ends; output pumps are drained until EOF.
    pub input: bool,
    buf: Vec<u8>,
    eof: bool,
    /// The pty output's escape-sequence filter; other pumps copy bytes exactly.
    filter: Option<TermFilter>,
}

/// A descriptor in a pump.
#[derive(Debug)]
pub enum Endpoint {
    /// An fd we own (pipe end or pty master; non-blocking). Shared ones are duplicated.
    Owned(OwnedFd),
    /// One of the caller's stdio descriptors (0, 1, 2).
    Caller(crate::sys::exec::StdFd),
    /// Closed after EOF.
    Closed,
}

impl Endpoint {
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        match self {
            Endpoint::Owned(fd) => Some(fd.as_fd()),
            Endpoint::Caller(n) => Some(n.borrow()),
            Endpoint::Closed => None,
        }
    }
}

impl Pump {
    pub fn new(src: Endpoint, dst: Endpoint, input: bool) -> io::Result<Self> {
        for end in [&src, &dst] {
            if let Endpoint::Owned(fd) = end {
                let flags = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL)?);
                fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
            }
        }
        Ok(Self { src, dst, input, buf: Vec::new(), eof: false, filter: None })
    }

    /// This pump's bytes go through `filter` (the pty master's output to a terminal).
    pub fn filtered(self, filter: TermFilter) -> Self {
        Self { filter: Some(filter), ..self }
    }

    /// Whether the filter passed a sequence the terminal answers.
    pub fn relayed_a_query(&self) -> bool {
        self.filter.as_ref().is_some_and(TermFilter::relayed_a_query)
    }
}

/// What the relay loop reports to its owner.
pub trait Events {
    /// A signal arrived for the supervisor.
    fn signal(&mut self, sig: Signal);
    /// True once the sandbox has ended.
    fn finished(&self) -> bool;
    /// A further descriptor to wait on (the session's stop notice); [`Events::woken`] is
    /// called when it is readable. An owner that keeps returning a readable descriptor gets
    /// called on every round, so it returns `None` once it has acted.
    fn wake_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }
    fn woken(&mut self) {}
    /// The sandbox's own report that it ended ([`super::inside::exit_message`]), read by
    /// [`Events::reported`] when readable; `None` once read (or when there is none).
    fn report_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }
    fn reported(&mut self) {}
}

const CHUNK: usize = 64 * 1024;
/// After the sandbox ended, output still in flight is drained for at most this long.
const DRAIN: Duration = Duration::from_secs(2);

/// Runs until the sandbox ended and every output pump reached EOF (or the drain timed out).
pub fn run(pumps: &mut [Pump], signals: &SignalFd, events: &mut dyn Events) -> io::Result<()> {
    let mut drain_deadline: Option<Instant> = None;
    loop {
        if events.finished() {
            for p in pumps.iter_mut().filter(|p| p.input) {
                p.eof = true;
                p.buf.clear();
                p.dst = Endpoint::Closed;
            }
            if pumps.iter().all(|p| p.eof && p.buf.is_empty()) {
                return Ok(());
            }
            let deadline = *drain_deadline.get_or_insert_with(|| Instant::now() + DRAIN);
            if Instant::now() >= deadline {
                return Ok(());
            }
        }
        // Build the poll set: signalfd first, then each pump's src (if room) or dst (if data).
        let mut fds: Vec<PollFd<'_>> = vec![PollFd::new(signals.as_fd(), PollFlags::POLLIN)];
        // The wake fd and the report fd, if any, come next; the pumps' follow.
        let wake = events.wake_fd().map(|fd| PollFd::new(fd, PollFlags::POLLIN));
        let report = events.report_fd().map(|fd| PollFd::new(fd, PollFlags::POLLIN));
        let wake_at = wake.is_some().then_some(fds.len());
        fds.extend(wake);
        let report_at = report.is_some().then_some(fds.len());
        fds.extend(report);
        let first_pump = fds.len();
        let mut map: Vec<(usize, bool)> = Vec::new();
        for (i, p) in pumps.iter().enumerate() {
            if !p.buf.is_empty() {
                if let Some(fd) = p.dst.fd() {
                    fds.push(PollFd::new(fd, PollFlags::POLLOUT));
                    map.push((i, false));
                }
            } else if !p.eof
                && let Some(fd) = p.src.fd()
            {
                fds.push(PollFd::new(fd, PollFlags::POLLIN));
                map.push((i, true));
            }
        }
        let timeout =
            if drain_deadline.is_some() { PollTimeout::from(100u16) } else { PollTimeout::NONE };
        match poll(&mut fds, timeout) {
            Ok(_) => {}
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
        let ready: Vec<(usize, bool, PollFlags)> = fds[first_pump..]
            .iter()
            .zip(&map)
            .filter_map(|(fd, (i, reading))| {
                let r = fd.revents().unwrap_or(PollFlags::empty());
                (!r.is_empty()).then_some((*i, *reading, r))
            })
            .collect();
        let sig_ready = fds[0].revents().is_some_and(|r| r.contains(PollFlags::POLLIN));
        let ready_at = |at: Option<usize>| {
            at.and_then(|i| fds.get(i)).and_then(PollFd::revents).is_some_and(|r| !r.is_empty())
        };
        let (woken, reported) = (ready_at(wake_at), ready_at(report_at));
        drop(fds);
        if reported {
            events.reported();
        }
        if woken {
            events.woken();
        }
        if sig_ready {
            while let Ok(Some(info)) = signals.read_signal() {
                if let Ok(sig) = Signal::try_from(info.ssi_signo as i32) {
                    events.signal(sig);
                }
            }
        }
        for (i, reading, _) in ready {
            let p = &mut pumps[i];
            if reading {
                read_into(p)?;
            } else {
                write_from(p)?;
            }
        }
    }
}

fn read_into(p: &mut Pump) -> io::Result<()> {
    let Some(fd) = p.src.fd() else {
        p.eof = true;
        return Ok(());
    };
    let mut buf = vec![0u8; CHUNK];
    match nix::unistd::read(fd, &mut buf) {
        Ok(0) => finish_src(p),
        Ok(n) => {
            buf.truncate(n);
            p.buf = match &mut p.filter {
                Some(filter) => {
                    let mut out = Vec::with_capacity(n);
                    filter.feed(&buf, &mut out);
                    out
                }
                None => buf,
            };
            // Writes to the caller's descriptors are blocking: do them right away.
            if matches!(p.dst, Endpoint::Caller(_)) {
                write_from(p)?;
            }
        }
        Err(Errno::EAGAIN | Errno::EINTR) => {}
        // A pty master reports EIO once every slave fd is closed: that is its EOF.
        Err(_) => finish_src(p),
    }
    Ok(())
}

fn finish_src(p: &mut Pump) {
    p.eof = true;
    p.src = Endpoint::Closed;
    if let Some(filter) = &mut p.filter {
        filter.finish(&mut p.buf);
    }
    if p.input && p.buf.is_empty() {
        // Closing the sandbox's stdin pipe delivers EOF to the command. For a pty the master
        // is shared with the output pump, whose own handle stays open.
        p.dst = Endpoint::Closed;
    }
}

fn write_from(p: &mut Pump) -> io::Result<()> {
    while !p.buf.is_empty() {
        let Some(fd) = p.dst.fd() else {
            p.buf.clear();
            return Ok(());
        };
        match nix::unistd::write(fd, &p.buf) {
            Ok(n) => {
                p.buf.drain(..n);
            }
            Err(Errno::EINTR) => {}
            Err(Errno::EAGAIN) => return Ok(()),
            // The reader went away (EPIPE, EIO): drop what it will never read.
            Err(_) => {
                p.buf.clear();
                p.dst = Endpoint::Closed;
                if p.input {
                    p.eof = true;
                    p.src = Endpoint::Closed;
                }
            }
        }
    }
    if p.input && p.eof {
        p.dst = Endpoint::Closed;
    }
    Ok(())
}

/// Raw fd number of an endpoint (for tests and diagnostics).
pub fn raw(e: &Endpoint) -> Option<i32> {
    e.fd().map(|fd| fd.as_raw_fd())
}
