//! Memory of one live session as PSS (issue 22): `/proc/<pid>/smaps_rollup` of the supervisor
//! (`airlock exec`, host side) and init (PID 1 inside) one second into `airlock exec -- sleep 3`
//! through a warm `airlockd` (activated on the first call on a socket in a temp directory), and
//! of bwrap's own processes for `bwrap --unshare-all --ro-bind / / sleep 3`, measured the same
//! way in the same run, rounds interleaved, medians printed. PSS is the fair share: RSS counts
//! the binary's pages shared between supervisor and init (a fork) twice. Prints, never asserts.
//!
//! Run: `cargo bench --bench session_memory` (release profile; `-- --rounds N`, default 5;
//! `-- --user NAME` adds rounds as that unprivileged user, via `setpriv`, when run as root;
//! `-- --detail` prints each process's largest mappings by PSS once; `-- --before DIR` adds
//! rounds of another build's `airlock`/`airlockd` from DIR, interleaved).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// One process's `smaps_rollup` fields of interest, in KiB.
#[derive(Clone, Copy, Debug, Default)]
struct Mem {
    rss: u64,
    pss: u64,
    pss_anon: u64,
    pss_file: u64,
}

fn rollup(pid: u32) -> Mem {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    let f = |k: &str| {
        text.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Mem { rss: f("Rss:"), pss: f("Pss:"), pss_anon: f("Pss_Anon:"), pss_file: f("Pss_File:") }
}

/// The largest mappings of `pid` by PSS: (KiB, private dirty KiB, what).
fn detail(pid: u32) -> Vec<(u64, u64, String)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut out: Vec<(u64, u64, String)> = Vec::new();
    let mut name = String::new();
    let mut pss = 0;
    for l in text.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.first().is_some_and(|a| a.contains('-') && !a.ends_with(':')) {
            if pss > 0 {
                out.push((pss, 0, name.clone()));
            }
            pss = 0;
            name = format!("{} {}", f.get(1).unwrap_or(&""), f.get(5..).unwrap_or(&[]).join(" "));
        } else if f.first() == Some(&"Pss:") {
            pss = f[1].parse().unwrap_or(0);
        } else if f.first() == Some(&"Private_Dirty:")
            && let Some(last) = Some(f[1].parse::<u64>().unwrap_or(0))
        {
            // Private dirty follows Pss in smaps; keep it with the mapping being read.
            out.push((pss, last, name.clone()));
            pss = 0;
        }
    }
    out.sort_by_key(|m| std::cmp::Reverse(m.0));
    out.truncate(12);
    out
}

fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return out };
    for t in tasks.flatten() {
        let text = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        out.extend(text.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
    }
    out
}

fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim().to_owned()
}

/// `root` and its descendants, minus the measured command (`sleep`) itself.
fn tree(root: u32) -> Vec<u32> {
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        out.extend(children(out[i]));
        i += 1;
    }
    out.retain(|&p| comm(p) != "sleep");
    out
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

struct Setup {
    label: String,
    airlock: PathBuf,
    home: PathBuf,
    repo: PathBuf,
    sock: PathBuf,
    user: Option<String>,
}

impl Setup {
    fn command(&self, prog: &Path) -> Command {
        let mut cmd = match &self.user {
            Some(u) => {
                let mut c = Command::new("setpriv");
                // The environment set below passes through (no --reset-env: it would reset
                // HOME to the user's own).
                c.args(["--reuid", u, "--regid", u, "--init-groups", "--"]).arg(prog);
                c
            }
            None => Command::new(prog),
        };
        cmd.current_dir(&self.repo).env_clear().env("HOME", &self.home);
        cmd.env("PATH", "/usr/bin:/bin").stdin(Stdio::null()).stdout(Stdio::null());
        cmd
    }
}

/// Starts `cmd`, waits a second, measures every process of its tree but `sleep`.
fn live(mut cmd: Command, show: bool) -> Vec<(String, Mem)> {
    let mut child: Child = cmd.spawn().expect("spawn");
    std::thread::sleep(Duration::from_millis(1000));
    // setpriv execs in place, so the child is the supervisor (or bwrap) itself.
    let pids = tree(child.id());
    let out: Vec<(String, Mem)> =
        pids.iter().enumerate().map(|(i, &p)| (format!("{}#{i}", comm(p)), rollup(p))).collect();
    if show {
        for &p in &pids {
            println!("  largest mappings of {} (pid {p}), PSS KiB / private dirty KiB:", comm(p));
            for (pss, dirty, name) in detail(p) {
                println!("    {pss:>6} {dirty:>6}  {name}");
            }
        }
    }
    let _ = child.wait();
    out
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rounds: usize = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1))
        .map_or(5, |v| v.parse().unwrap());
    let user = args.iter().position(|a| a == "--user").and_then(|i| args.get(i + 1)).cloned();
    let mut show = args.iter().any(|a| a == "--detail");
    let root_user = nix::unistd::geteuid().is_root();

    // Everything in one world-traversable temp directory, so an unprivileged round can use it.
    let tmp = tempfile::Builder::new().prefix("airlock-mem").tempdir_in("/var/tmp").unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // Binaries to compare: this build's, and with `--before DIR` another build's (DIR holds its
    // `airlock` and `airlockd`), interleaved in the same rounds.
    let mut builds = vec![(
        String::new(),
        PathBuf::from(env!("CARGO_BIN_EXE_airlock")),
        PathBuf::from(env!("CARGO_BIN_EXE_airlockd")),
    )];
    if let Some(dir) = args.iter().position(|a| a == "--before").and_then(|i| args.get(i + 1)) {
        let dir = Path::new(dir);
        builds.push(("before, ".to_owned(), dir.join("airlock"), dir.join("airlockd")));
    }
    let mut setups = Vec::new();
    let mut who = vec![None];
    if root_user && let Some(u) = &user {
        who.push(Some(u.clone()));
    }
    for (b, (tag, airlock, airlockd)) in builds.iter().enumerate() {
        let bin_dir = tmp.path().join(format!("bin{b}"));
        std::fs::create_dir_all(&bin_dir).unwrap();
        std::fs::set_permissions(&bin_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::copy(airlock, bin_dir.join("airlock")).unwrap();
        std::fs::copy(airlockd, bin_dir.join("airlockd")).unwrap();
        for (i, u) in who.iter().enumerate() {
            let base = tmp.path().join(format!("b{b}u{i}"));
            let (home, repo, run) = (base.join("home"), base.join("repo"), base.join("run"));
            for d in [home.join(".airlock"), repo.join(".git"), run.clone()] {
                std::fs::create_dir_all(d).unwrap();
            }
            std::fs::write(
                home.join(".airlock/config.toml"),
                "[network]\nallow = [\"example.test\"]\n",
            )
            .unwrap();
            // The daemon's socket directory must be private to its user.
            std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o700)).unwrap();
            if let Some(u) = u {
                let ok =
                    Command::new("chown").args(["-R", &format!("{u}:{u}")]).arg(&base).status();
                assert!(ok.is_ok_and(|s| s.success()), "chown to {u}");
            }
            std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
            let name = u.as_deref().unwrap_or(if root_user { "root" } else { "user" });
            setups.push(Setup {
                label: format!("{tag}{name}"),
                airlock: bin_dir.join("airlock"),
                home,
                repo,
                sock: run.join("airlock.sock"),
                user: u.clone(),
            });
        }
    }
    let bwrap = ["/usr/bin/bwrap", "/bin/bwrap"].iter().map(PathBuf::from).find(|p| p.exists());

    // label -> per-process-role -> samples
    let mut samples: BTreeMap<String, BTreeMap<String, Vec<Mem>>> = BTreeMap::new();
    println!(
        "# session memory, PSS from smaps_rollup ({rounds} rounds interleaved); load {}",
        loadavg()
    );
    for _ in 0..rounds {
        for s in &setups {
            let who = &s.label;
            let mut cmd = s.command(&s.airlock);
            cmd.env("AIRLOCK_SOCKET", &s.sock).args(["exec", "--", "sleep", "3"]);
            let label = format!("airlock exec ({who})");
            for (i, (name, m)) in live(cmd, show).into_iter().enumerate() {
                let role = match i {
                    0 => "supervisor".to_owned(),
                    1 => "init".to_owned(),
                    _ => name,
                };
                samples.entry(label.clone()).or_default().entry(role).or_default().push(m);
            }
            if let Some(b) = bwrap.as_ref().filter(|_| !s.label.starts_with("before")) {
                let mut cmd = s.command(b);
                cmd.args(["--unshare-all", "--ro-bind", "/", "/", "sleep", "3"]);
                let label = format!("bwrap ({who})");
                for (i, (_, m)) in live(cmd, show).into_iter().enumerate() {
                    let role = format!("bwrap process {}", i + 1);
                    samples.entry(label.clone()).or_default().entry(role).or_default().push(m);
                }
            }
            show = false;
        }
    }
    for (label, roles) in &samples {
        let (mut rss, mut pss) = (0, 0);
        for (role, ms) in roles {
            let m = Mem {
                rss: median(ms.iter().map(|m| m.rss).collect()),
                pss: median(ms.iter().map(|m| m.pss).collect()),
                pss_anon: median(ms.iter().map(|m| m.pss_anon).collect()),
                pss_file: median(ms.iter().map(|m| m.pss_file).collect()),
            };
            println!(
                "  {label:<24} {role:<18} RSS {:>6} KiB  PSS {:>6} KiB (anon {:>5}, file {:>5})",
                m.rss, m.pss, m.pss_anon, m.pss_file
            );
            rss += m.rss;
            pss += m.pss;
        }
        println!(
            "{label}: total PSS {:.2} MiB, RSS {:.2} MiB (medians per process; load {})",
            pss as f64 / 1024.0,
            rss as f64 / 1024.0,
            loadavg()
        );
    }
    // Stop the daemons this run activated (each serves only its own temp socket).
    for s in &setups {
        stop_daemon(&s.sock);
    }
}

/// Ends the `airlockd` whose environment names `sock` (the one this run activated).
fn stop_daemon(sock: &Path) {
    let want = format!("AIRLOCK_SOCKET={}", sock.display());
    let Ok(dir) = std::fs::read_dir("/proc") else { return };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        if comm(pid as u32) != "airlockd" {
            continue;
        }
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        if env.split(|&b| b == 0).any(|v| v == want.as_bytes()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
    }
}
