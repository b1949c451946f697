//! Telling the person at the host that their session's agent is waiting at a gate
//! (docs/gates.md, "Deciding"): while a session whose policy has `[gate]` entries runs, one
//! thread watches airlockd's gate book and, for each new gate of this session, writes a
//! warning through the CLI's log (on stderr for `airlock exec`; while `airlock run`'s relay has
//! the terminal raw it goes to `~/.airlock/airlock.log`, counted in the line printed when raw
//! mode ends) and, on a desktop, sends a notification with `notify-send`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::client::Endpoint;
use crate::env::Env;
use crate::protocol::{self, GateInfo};

/// How long to wait before watching again after the daemon went away (it restarts on the
/// next connection; the session re-registers with it meanwhile).
const RECONNECT: Duration = Duration::from_secs(1);

/// The desktop notifier to use: `notify-send` from `PATH` when a graphical session is there
/// (`WAYLAND_DISPLAY` or `DISPLAY`).
pub fn desktop_notifier(env: &dyn Env) -> Option<PathBuf> {
    let graphical =
        ["WAYLAND_DISPLAY", "DISPLAY"].iter().any(|v| env.var(v).is_some_and(|s| !s.is_empty()));
    if !graphical {
        return None;
    }
    let path = env.var("PATH")?;
    path.split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join("notify-send"))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Watches for `session`'s gates until `stop` is set. Never fails the session: a watcher that
/// cannot connect retries, and its thread ends with the process.
pub fn spawn(endpoint: Endpoint, session: String, notifier: Option<PathBuf>) -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let spawned = std::thread::Builder::new()
        .name("gate-notice".into())
        .spawn(move || watch(&endpoint, &session, notifier.as_deref(), &flag));
    if let Err(e) = spawned {
        tracing::warn!("cannot watch for this session's gate requests: {e}");
    }
    stop
}

fn watch(endpoint: &Endpoint, session: &str, notifier: Option<&Path>, stop: &AtomicBool) {
    let mut seen = BTreeSet::new();
    watch_session(endpoint, session, stop, protocol::MAX_GATE_WAIT_MS, |gates| {
        for g in &gates {
            if seen.insert(g.id.clone()) {
                tell(g, notifier);
            }
        }
        seen.retain(|id| gates.iter().any(|g| &g.id == id));
        true
    });
}

/// Long-polls airlockd's book (each poll at most `wait_ms`) and hands `on_change` the pending
/// gates of `session` after each change, and an empty list while airlockd cannot be reached
/// (its holds went with it); until `stop` is set or `on_change` answers false. The session's
/// gate notices and its relay to a review server both watch this way.
pub fn watch_session(
    endpoint: &Endpoint,
    session: &str,
    stop: &AtomicBool,
    wait_ms: u64,
    mut on_change: impl FnMut(Vec<GateInfo>) -> bool,
) {
    while !stop.load(Ordering::Acquire) {
        let mut client = match endpoint.connect() {
            Ok(c) if c.capabilities.contains(protocol::GATES) => c,
            // A daemon without gates refused the session already (`client::session`).
            Ok(_) => return,
            Err(_) => {
                if !on_change(Vec::new()) {
                    return;
                }
                std::thread::sleep(RECONNECT);
                continue;
            }
        };
        let mut version = None;
        while !stop.load(Ordering::Acquire) {
            let Ok((v, gates)) = client.gate_list(version, Some(wait_ms)) else {
                break;
            };
            version = Some(v);
            if stop.load(Ordering::Acquire) {
                return;
            }
            let mine = gates.into_iter().filter(|g| g.session == session).collect();
            if !on_change(mine) {
                return;
            }
        }
        std::thread::sleep(RECONNECT);
    }
}

/// The notice for one gate: what waits, and the commands that decide it.
pub fn notice(g: &GateInfo) -> String {
    format!(
        "gate {id}: the agent's {target} waits for your approval ({severity}, rule \
         {rule:?}, until {deadline}); `airlock gate approve {id}` or `airlock gate deny {id}`",
        id = g.id,
        target = crate::cli::gate::target(g),
        severity = g.severity,
        rule = g.rule,
        deadline = g.deadline,
    )
}

fn tell(g: &GateInfo, notifier: Option<&Path>) {
    let body = format!(
        "{} {}:{} waits for approval.\nairlock gate approve {}",
        g.method, g.host, g.port, g.id
    );
    announce(&notice(g), &body, notifier);
}

/// Tells the person at the host: `text` as a warning through the CLI's log, and `body` as a
/// desktop notification when `notifier` is given. Both are escaped or passed as arguments:
/// the agent chose parts of them.
pub fn announce(text: &str, body: &str, notifier: Option<&Path>) {
    tracing::warn!("{}", crate::audit::escape_for_terminal(text));
    if let Some(bin) = notifier {
        // Arguments, never a shell; nothing of ours is inherited but the environment.
        let spawned = std::process::Command::new(bin)
            .args(["--app-name=airlock", "--urgency=critical", "Airlock: a gate is waiting"])
            .arg(body)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
        match spawned {
            // Reaped off this thread so a slow notifier never delays the next notice.
            Ok(mut child) => {
                std::thread::spawn(move || child.wait());
            }
            Err(e) => tracing::debug!("notify-send failed: {e}"),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::env::MapEnv;

    #[test]
    fn a_desktop_notifier_needs_a_display_and_notify_send_on_path() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("notify-send");
        std::fs::write(&bin, "#!/bin/sh\n").unwrap();
        let path = format!("/nonexistent:{}", dir.path().display());
        let env = MapEnv::new().with("PATH", &path);
        assert_eq!(desktop_notifier(&env), None, "no display, no notification");
        let env = MapEnv::new().with("PATH", &path).with("DISPLAY", ":1");
        assert_eq!(desktop_notifier(&env), None, "not executable");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(desktop_notifier(&env), Some(bin.clone()));
        let env = MapEnv::new().with("PATH", &path).with("WAYLAND_DISPLAY", "wayland-0");
        assert_eq!(desktop_notifier(&env), Some(bin));
    }
}
