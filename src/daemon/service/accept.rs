//! The accept loop: settles earlier writers' journals, reports ready, accepts control
//! connections until idle, `quit_if_idle` or SIGTERM/SIGINT, then drains (DESIGN §6).

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::net::UnixListener;
use tokio::task::JoinSet;

use super::state::{Daemon, IdleClock, blocking, lock};
use super::{Options, ServiceError, connection};
use crate::audit;
use crate::daemon::notify;

/// Why the accept loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopReason {
    Idle,
    Signal,
    Quit,
}

/// Serves the control socket until idle, `quit_if_idle` or SIGTERM.
pub async fn serve(listener: OwnedFd, options: Options) -> Result<(), ServiceError> {
    let std_listener = std::os::unix::net::UnixListener::from(listener);
    let listener = UnixListener::from_std(std_listener).map_err(ServiceError::Listener)?;
    let daemon = Daemon::new(options);
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(ServiceError::Signal)?;
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(ServiceError::Signal)?;

    // Settlement, the test resolver file and the managed layer are file I/O: off the runtime.
    let d = Arc::clone(&daemon);
    let started = blocking(move || {
        settle_journals(&d);
        // Build the (possibly file-backed) resolver once so a broken test resolver shows up
        // early.
        if let Err(e) = d.resolver() {
            tracing::error!("{e}");
        }
        if let Err(e) = d.config_check() {
            // Stay up and answer with the error (DESIGN §6).
            tracing::error!("{e}");
        }
    })
    .await;
    if let Err(e) = started {
        tracing::error!("{e}");
    }
    notify::ready(&notify::describe(0, 0));
    tracing::info!(boot = %daemon.boot, "airlockd ready");

    let mut tasks = JoinSet::new();
    let mut idle = IdleClock::new(Instant::now());
    // Tunnels open and close inside the proxy; refresh STATUS= periodically while busy.
    let mut status_tick = tokio::time::interval(Duration::from_secs(2));
    status_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let reason = loop {
        let is_idle = daemon.active() == 0;
        let deadline = tokio::time::Instant::from_std(idle.deadline(daemon.options.idle_timeout));
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    daemon.conns.fetch_add(1, Ordering::SeqCst);
                    let d = Arc::clone(&daemon);
                    tasks.spawn(async move {
                        connection::handle_connection(&d, stream).await;
                        d.conns.fetch_sub(1, Ordering::SeqCst);
                        d.activity.notify_one();
                    });
                }
                Err(err) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::error!("accept failed: {err}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            () = tokio::time::sleep_until(deadline), if is_idle => {
                if daemon.active() == 0 {
                    break StopReason::Idle;
                }
            }
            () = daemon.activity.notified() => {
                // Something just ended; if that made us idle, the timeout starts now.
                if daemon.active() == 0 {
                    idle = IdleClock::new(Instant::now());
                }
            }
            () = daemon.quit.notified() => break StopReason::Quit,
            _ = status_tick.tick(), if daemon.session_count() > 0 => daemon.notify_status(),
            _ = sigterm.recv() => break StopReason::Signal,
            _ = sigint.recv() => break StopReason::Signal,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
        idle.observe(daemon.active(), Instant::now());
    };

    let why = match reason {
        StopReason::Idle => "idle",
        StopReason::Signal => "terminating",
        StopReason::Quit => "quitting on request (version skew)",
    };
    #[cfg(feature = "test-hooks")]
    if let Some(ms) =
        daemon.env.var(super::TEST_DRAIN_DELAY_VAR).and_then(|v| v.parse::<u64>().ok())
    {
        // Widens the window between STOPPING and dropping the listener so a test can connect
        // inside it deterministically.
        notify::stopping("draining (test delay)");
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    notify::stopping(&format!(
        "{why}; {}",
        notify::describe(daemon.session_count(), daemon.tunnels())
    ));
    // Drop our copy of the socket: the service manager keeps it, pending clients wait for the
    // next instance. Never shutdown(2), never unlink.
    drop(listener);
    daemon.stop_tx.send_replace(true);
    // Session proxies stop accepting; open tunnels get the grace period, then are closed and
    // logged `interrupted`. Supervisors re-register with the next instance.
    for s in lock(&daemon.sessions).sessions() {
        s.stop_proxy();
    }
    let proxies = std::mem::take(&mut *lock(&daemon.proxies));
    let drain = async {
        while tasks.join_next().await.is_some() {}
        for p in proxies {
            let _ = p.await;
        }
    };
    if reason == StopReason::Signal {
        // In-flight requests finish; open tunnels get the grace period, after which each
        // session proxy closes its own and logs them `interrupted` with their byte counts. This
        // outer bound must outlast that, or the runtime is dropped first and the journal's bare
        // record (no counts) is all that is logged; it only cuts what will not end by itself
        // (a control connection mid-request).
        let bound = daemon.options.shutdown_grace + CLOSE_MARGIN;
        if tokio::time::timeout(bound, drain).await.is_err() {
            tracing::warn!("grace period over; closing remaining connections");
        }
    } else {
        drain.await;
    }
    tracing::info!(boot = %daemon.boot, "airlockd exiting ({why})");
    Ok(())
}

/// How long after the grace period the session proxies get to close their remaining tunnels
/// and write those tunnels' final lines.
const CLOSE_MARGIN: Duration = Duration::from_secs(2);

/// Settles in-flight journals that no live writer holds (DESIGN §5), for every repo: tunnels
/// that were open when an earlier writer died become `"interrupted": true` lines. Blocking.
fn settle_journals(daemon: &Daemon) {
    let paths = match daemon.paths() {
        Ok(p) => p,
        Err(e) => {
            tracing::error!("cannot settle journals: {e}");
            return;
        }
    };
    match audit::settle_all(&paths.logs_root()) {
        Ok(r) if r.lines_written > 0 => {
            tracing::info!("settled {} interrupted attempt(s) of earlier writers", r.lines_written);
        }
        Ok(_) => {}
        Err(e) => tracing::error!("settling journals: {e}"),
    }
}
