//! `airlock status`: whether airlockd is up (activating it where DESIGN §6 allows, never with
//! `--no-start`), its version, binary, pid and uptime, and each session with its repo, user,
//! tunnels and bytes.

use std::io::Write;

use crate::client::Endpoint;
use crate::protocol::StatusReply;

use super::Context;

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Print the daemon's status as JSON.
    #[arg(long)]
    pub json: bool,
    /// Never start airlockd to answer: if it is not running, say so and exit 3 (with a
    /// service manager, its service state is asked instead of its socket)
    #[arg(long)]
    pub no_start: bool,
}

/// `status --no-start` when airlockd is not running (the LSB "program is not running" code,
/// as `systemctl status` uses it).
pub const EXIT_NOT_RUNNING: i32 = 3;

pub fn run(args: &StatusArgs, ctx: &Context<'_>) -> i32 {
    let endpoint = Endpoint::resolve(ctx.env);
    let status = if args.no_start {
        endpoint.status_if_running().map(|s| s.ok_or(()))
    } else {
        endpoint.status().map(Ok)
    };
    let status = match status {
        Ok(Ok(s)) => s,
        Ok(Err(())) => {
            let path = endpoint.socket.path.display();
            if args.json {
                println!("{}", serde_json::json!({ "running": false, "socket": path.to_string() }));
            } else {
                println!("airlockd is not running (socket {path}; not started: --no-start)");
            }
            return EXIT_NOT_RUNNING;
        }
        Err(err) => {
            eprintln!("airlock: {err}");
            return err.exit_code();
        }
    };
    let mut out = std::io::stdout().lock();
    let res = if args.json {
        serde_json::to_writer_pretty(&mut out, &status)
            .map_err(std::io::Error::other)
            .and_then(|()| writeln!(out))
    } else {
        write!(out, "{}", render(&status, &endpoint.socket.path.display().to_string()))
    };
    match res {
        Ok(()) => 0,
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(err) => {
            eprintln!("airlock: cannot write the status: {err}");
            125
        }
    }
}

fn human_duration(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 { format!("{n} B") } else { format!("{v:.1} {}", UNITS[u]) }
}

/// The human-readable status.
pub fn render(s: &StatusReply, socket: &str) -> String {
    let mut o = String::new();
    o.push_str(&format!("airlockd {} is up (protocol {})\n", s.daemon_version, s.protocol));
    o.push_str(&format!("  binary:     {}\n", s.binary));
    o.push_str(&format!("  pid:        {}\n", s.pid));
    o.push_str(&format!(
        "  uptime:     {} (since {})\n",
        human_duration(s.uptime_ms),
        s.started_at
    ));
    o.push_str(&format!("  socket:     {socket} ({})\n", s.activation));
    o.push_str(&format!("  idle exit:  after {}\n", human_duration(s.idle_timeout_ms)));
    if let Some(e) = &s.config_error {
        o.push_str(&format!("  config:     ERROR: {e}\n"));
    }
    if s.sessions.is_empty() {
        o.push_str("  sessions:   none\n");
    } else {
        o.push_str(&format!("  sessions:   {} ({} tunnels)\n", s.sessions.len(), s.tunnels));
        for x in &s.sessions {
            let user = x.email.as_deref().or(x.user_id.as_deref()).unwrap_or("unattributed");
            o.push_str(&format!(
                "    {}  repo {} ({})  user {}  agent {}  tunnels {}  sent {}  received {}{}{}\n",
                x.session,
                x.repo,
                x.repo_path,
                user,
                x.agent.as_deref().unwrap_or("-"),
                x.tunnels,
                human_bytes(x.bytes_sent),
                human_bytes(x.bytes_recv),
                x.phase.as_deref().map(|p| format!("  phase {p}")).unwrap_or_default(),
                if x.serving { "" } else { "  (proxy not serving)" }
            ));
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations_read_naturally() {
        assert_eq!(human_bytes(10), "10 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_duration(61_000), "1m01s");
        assert_eq!(human_duration(7_260_000), "2h01m");
    }
}
