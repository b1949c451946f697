//! The tunnel pump: moves bytes both ways between the agent's socket and the upstream socket
//! with Linux `splice(2)` through a pipe per direction (the bytes never enter user space), and
//! falls back to a copy loop with a large buffer where splice is unavailable. Half-closes are
//! propagated (`shutdown(SHUT_WR)` on the other side at EOF, RFC 9293 §3.6), so protocols that
//! signal "done sending" by a FIN keep working.
//!
//! A direction starts by copying through its worker thread's scratch buffer and makes its pipe
//! (asking for 1 MiB) only once a read shows bulk data, so an idle or short tunnel costs two
//! sockets and one small task, and a CONNECT that closes without data makes no pipe at all.
//! A pipe, once made, lives until the tunnel ends (an empty pipe holds no data pages).

use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::sys::splice::{nonblocking_pipe, set_pipe_size, splice};

/// What one read of the copy phase takes at most. A read that fills it is taken as the start of
/// a bulk transfer, and the direction switches to splice through a pipe.
const SCRATCH: usize = 32 * 1024;
/// The pipe a bulk direction asks for while [`LARGE_PIPE_BUDGET`] allows (the C splice relay's
/// figure: fewer splices and wakeups per megabyte).
const PIPE_LARGE: usize = 1024 * 1024;
/// The sizes tried otherwise, in turn; the kernel may clamp or refuse them
/// (`/proc/sys/fs/pipe-max-size`, per-user pipe limits), and the default 64 KiB is the floor.
const PIPE_SIZES: [usize; 2] = [256 * 1024, 128 * 1024];
/// How many 1 MiB pipes the process holds at once. Pipe pages count against the user's
/// `pipe-user-pages-soft` allowance (pipe(7): 16384 pages by default), past which *every* new
/// pipe of that user — the developer's shells and build jobservers included — gets 8 KiB; 16
/// large pipes are a quarter of it, and further bulk directions use 256 KiB, as before.
const LARGE_PIPE_BUDGET: usize = 16;
static LARGE_PIPES: AtomicUsize = AtomicUsize::new(0);

/// One of [`LARGE_PIPE_BUDGET`]'s slots, given back on drop.
struct LargePipeSlot;

impl LargePipeSlot {
    fn take() -> Option<Self> {
        LARGE_PIPES
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < LARGE_PIPE_BUDGET).then_some(n + 1)
            })
            .ok()
            .map(|_| LargePipeSlot)
    }
}

impl Drop for LargePipeSlot {
    fn drop(&mut self) {
        LARGE_PIPES.fetch_sub(1, Ordering::AcqRel);
    }
}
/// Copy-loop buffer when splice is not available.
const COPY_BYTES: usize = 64 * 1024;

thread_local! {
    /// One copy-phase buffer per worker thread, shared by every tunnel it runs: a short or idle
    /// tunnel holds no buffer and no pipe of its own.
    static SCRATCH_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Live byte counts of one tunnel and of its whole session (`sent` = agent → upstream).
#[derive(Debug, Default)]
pub struct Meter {
    pub sent: AtomicU64,
    pub recv: AtomicU64,
    /// Milliseconds since the tunnel started at its last movement (for the idle timeout).
    last_ms: AtomicU64,
}

/// How a tunnel ended.
#[derive(Debug)]
pub enum TunnelEnd {
    /// Both sides finished (EOF both ways) or one side reset.
    Closed,
    /// No byte moved in either direction for the idle timeout.
    Idle,
    /// The session is shutting down and its grace period ran out.
    Drained,
    /// An I/O error other than a reset ended it.
    Failed(io::Error),
}

/// Pumps `client` ⇄ `upstream` until both directions end, the tunnel idles out, or `kill`
/// turns true. Counts into `tunnel` and `session`.
pub async fn pump(
    client: &TcpStream,
    upstream: &TcpStream,
    idle: Duration,
    mut kill: watch::Receiver<bool>,
    tunnel: &Meter,
    session: &Meter,
) -> TunnelEnd {
    let start = Instant::now();
    let up = one_way(client, upstream, Dir::Sent, tunnel, session, start);
    let down = one_way(upstream, client, Dir::Recv, tunnel, session, start);
    let both = async {
        let (a, b) = tokio::join!(up, down);
        match (a, b) {
            (Err(e), _) | (_, Err(e)) if !is_reset(&e) => TunnelEnd::Failed(e),
            _ => TunnelEnd::Closed,
        }
    };
    let idle_watch = async {
        loop {
            let last = Duration::from_millis(tunnel.last_ms.load(Ordering::Relaxed));
            let deadline = start + last + idle;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline.into()).await;
        }
    };
    let killed = async {
        // A dropped sender means the session is gone: treat it like a drain.
        let _ = kill.wait_for(|k| *k).await;
    };
    tokio::select! {
        end = both => end,
        () = idle_watch => TunnelEnd::Idle,
        () = killed => TunnelEnd::Drained,
    }
}

fn is_reset(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionAborted
    )
}

#[derive(Clone, Copy)]
enum Dir {
    Sent,
    Recv,
}

fn count(dir: Dir, n: usize, tunnel: &Meter, session: &Meter, start: Instant) {
    let n = n as u64;
    let (t, s) = match dir {
        Dir::Sent => (&tunnel.sent, &session.sent),
        Dir::Recv => (&tunnel.recv, &session.recv),
    };
    t.fetch_add(n, Ordering::Relaxed);
    s.fetch_add(n, Ordering::Relaxed);
    let ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
    tunnel.last_ms.store(ms, Ordering::Relaxed);
}

/// One direction: copies small reads through the worker's scratch buffer (no pipe, no
/// per-tunnel buffer: a short CONNECT makes no pipe at all), switches to splice through a
/// large pipe at the first read that fills the scratch buffer, and half-closes the destination
/// at EOF.
async fn one_way(
    src: &TcpStream,
    dst: &TcpStream,
    dir: Dir,
    tunnel: &Meter,
    session: &Meter,
    start: Instant,
) -> io::Result<()> {
    loop {
        src.readable().await?;
        match copy_once(src, dst)? {
            Copied::Again => continue,
            Copied::Eof => {
                half_close(dst);
                return Ok(());
            }
            Copied::Done { n, rest } => {
                // What went straight through counts now (a slow reader keeps the tunnel live).
                count(dir, n - rest.len(), tunnel, session, start);
                if !rest.is_empty() {
                    write_all(dst, &rest).await?;
                    count(dir, rest.len(), tunnel, session, start);
                }
                if n == SCRATCH {
                    break;
                }
            }
        }
    }
    // Bulk: splice from here on.
    let Ok((r, w)) = nonblocking_pipe() else {
        return copy_loop(src, dst, dir, tunnel, session, start).await;
    };
    let mut large = LargePipeSlot::take();
    let cap = match large.as_ref().and_then(|_| set_pipe_size(w.as_fd(), PIPE_LARGE).ok()) {
        Some(c) => c,
        None => {
            large = None;
            PIPE_SIZES
                .iter()
                .find_map(|&want| set_pipe_size(w.as_fd(), want).ok())
                .unwrap_or(64 * 1024)
        }
    };
    // Held until this direction ends (or falls back to copying, below).
    let large_slot = large;
    loop {
        src.readable().await?;
        let n = match src.try_io(Interest::READABLE, || splice(src.as_fd(), w.as_fd(), cap)) {
            Ok(0) => {
                half_close(dst);
                return Ok(());
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            // EINVAL: this kernel or fd pair cannot splice; nothing was moved yet in this call.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                // The pipe is empty (every splice in is written out before the next): give it
                // and its budget slot back before copying for the rest of the tunnel.
                drop((r, w, large_slot));
                return copy_loop(src, dst, dir, tunnel, session, start).await;
            }
            Err(e) => return Err(e),
        };
        let mut left = n;
        while left > 0 {
            // Straight to the write: the socket is writable far more often than not, so the
            // readiness wait only happens after a WouldBlock.
            match dst.try_io(Interest::WRITABLE, || splice(r.as_fd(), dst.as_fd(), left)) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(m) => {
                    left -= m;
                    count(dir, m, tunnel, session, start);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => dst.writable().await?,
                Err(e) => return Err(e),
            }
        }
    }
}

/// What one copy-phase step did.
enum Copied {
    /// Nothing to read after all (spurious readiness).
    Again,
    Eof,
    /// `n` bytes read; `rest` is the tail the destination would not take yet.
    Done {
        n: usize,
        rest: Vec<u8>,
    },
}

/// Reads once into the worker's scratch buffer and writes what it can straight on; only a tail
/// the destination refuses is copied out (the buffer cannot be held across an await).
fn copy_once(src: &TcpStream, dst: &TcpStream) -> io::Result<Copied> {
    SCRATCH_BUF.with_borrow_mut(|buf| {
        if buf.len() < SCRATCH {
            buf.resize(SCRATCH, 0);
        }
        let n = match src.try_read(&mut buf[..SCRATCH]) {
            Ok(0) => return Ok(Copied::Eof),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Copied::Again),
            Err(e) => return Err(e),
        };
        let mut off = 0;
        while off < n {
            match dst.try_write(&buf[off..n]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(m) => off += m,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        Ok(Copied::Done { n, rest: buf[off..n].to_vec() })
    })
}

/// The fallback: a user-space copy with one large buffer, allocated on first use.
async fn copy_loop(
    src: &TcpStream,
    dst: &TcpStream,
    dir: Dir,
    tunnel: &Meter,
    session: &Meter,
    start: Instant,
) -> io::Result<()> {
    let mut buf = vec![0u8; COPY_BYTES];
    loop {
        src.readable().await?;
        let n = match src.try_read(&mut buf) {
            Ok(0) => {
                half_close(dst);
                return Ok(());
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        };
        write_all(dst, &buf[..n]).await?;
        count(dir, n, tunnel, session, start);
    }
}

/// Writes all of `data` to a socket shared by reference (both pump directions hold it).
pub async fn write_all(dst: &TcpStream, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        dst.writable().await?;
        match dst.try_write(data) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(m) => data = &data[m..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `shutdown(SHUT_WR)`: tells the peer we are done sending. Errors (peer already gone) are
/// irrelevant here: the other direction reports them.
pub fn half_close(sock: &TcpStream) {
    let _ = nix::sys::socket::shutdown(
        std::os::fd::AsRawFd::as_raw_fd(sock),
        nix::sys::socket::Shutdown::Write,
    );
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (b, _) = l.accept().await.unwrap();
        (a, b)
    }

    #[tokio::test]
    async fn pumps_both_ways_and_propagates_half_close() {
        // agent <-> (client_side | proxy | upstream_side) <-> server
        let (mut agent, client_side) = pair().await;
        let (upstream_side, mut server) = pair().await;
        let (_tx, rx) = watch::channel(false);
        let tunnel = Meter::default();
        let session = Meter::default();
        let pumping = async {
            pump(&client_side, &upstream_side, Duration::from_secs(60), rx, &tunnel, &session).await
        };
        let talk = async {
            let big = vec![7u8; 3 * 1024 * 1024 + 17];
            agent.write_all(&big).await.unwrap();
            agent.shutdown().await.unwrap();
            let mut got = Vec::new();
            server.read_to_end(&mut got).await.unwrap();
            assert_eq!(got, big);
            server.write_all(b"reply after half-close").await.unwrap();
            server.shutdown().await.unwrap();
            let mut back = Vec::new();
            agent.read_to_end(&mut back).await.unwrap();
            assert_eq!(back, b"reply after half-close");
        };
        let (end, ()) = tokio::join!(pumping, talk);
        assert!(matches!(end, TunnelEnd::Closed), "{end:?}");
        assert_eq!(tunnel.sent.load(Ordering::Relaxed), 3 * 1024 * 1024 + 17);
        assert_eq!(tunnel.recv.load(Ordering::Relaxed), 22);
        assert_eq!(session.recv.load(Ordering::Relaxed), 22);
    }

    #[tokio::test]
    async fn idle_tunnel_ends() {
        let (_agent, client_side) = pair().await;
        let (upstream_side, _server) = pair().await;
        let (_tx, rx) = watch::channel(false);
        let m = Meter::default();
        let s = Meter::default();
        let end = pump(&client_side, &upstream_side, Duration::from_millis(50), rx, &m, &s).await;
        assert!(matches!(end, TunnelEnd::Idle), "{end:?}");
    }

    #[tokio::test]
    async fn kill_ends_tunnel() {
        let (_agent, client_side) = pair().await;
        let (upstream_side, _server) = pair().await;
        let (tx, rx) = watch::channel(false);
        let m = Meter::default();
        let s = Meter::default();
        let killer = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            tx.send(true).unwrap();
        };
        let (end, ()) = tokio::join!(
            pump(&client_side, &upstream_side, Duration::from_secs(60), rx, &m, &s),
            killer
        );
        assert!(matches!(end, TunnelEnd::Drained), "{end:?}");
    }
}
