//! Kernel probes: what the sandbox can put in force on this machine. The same module decides
//! what `exec` refuses over (mandatory layers), what it warns about (optional ones) and what
//! `airlock doctor` shows ([`report`]). Reads go through [`ProbeFs`] so tests (and CI, through
//! the `test-hooks` override) can present e.g. Ubuntu's AppArmor restriction.

use std::path::{Path, PathBuf};

use super::cgroup;
use crate::env::Env;

/// Test-only: a directory whose files shadow the real ones (`<dir>/proc/sys/...`).
pub const TEST_PROBE_ROOT_VAR: &str = "AIRLOCK_TEST_PROBE_ROOT";

/// The AppArmor profile shipped in `contrib/apparmor/airlock`.
pub const APPARMOR_FIX: &str = "Ubuntu restricts unprivileged user namespaces \
(kernel.apparmor_restrict_unprivileged_userns=1). Fix: install Airlock's AppArmor profile: \
`sudo install -m 644 contrib/apparmor/airlock /etc/apparmor.d/airlock && \
sudo apparmor_parser -r /etc/apparmor.d/airlock` (or, machine-wide and less safe: \
`sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`)";

/// Where probe reads come from.
pub trait ProbeFs {
    fn read(&self, path: &str) -> Option<String>;
    fn uid(&self) -> u32;
    fn landlock_abi(&self) -> Option<u32>;
    fn writable(&self, path: &Path) -> bool;
    fn pid(&self) -> u32 {
        std::process::id()
    }
    /// Whether the `cgroup.procs` file at `path` lists a process other than `pid` (an
    /// unreadable file lists none).
    fn lists_other_process(&self, path: &str, pid: u32) -> bool {
        self.read(path).is_some_and(|t| other_pid_listed(t.lines(), pid))
    }
}

/// Whether `lines` of a `cgroup.procs` name a pid other than `pid`; stops at the first.
fn other_pid_listed<S: AsRef<str>>(lines: impl IntoIterator<Item = S>, pid: u32) -> bool {
    let pid = pid.to_string();
    lines.into_iter().any(|l| l.as_ref().split_whitespace().any(|p| p != pid))
}

/// The running host, optionally shadowed by a test directory.
#[derive(Debug, Clone, Default)]
pub struct HostFs {
    shadow: Option<PathBuf>,
}

impl HostFs {
    /// The real host; with `test-hooks`, honours [`TEST_PROBE_ROOT_VAR`].
    pub fn from_env(env: &dyn Env) -> Self {
        #[cfg(feature = "test-hooks")]
        if let Some(dir) = env.var(TEST_PROBE_ROOT_VAR) {
            return Self { shadow: Some(PathBuf::from(dir)) };
        }
        let _ = env;
        Self { shadow: None }
    }
}

impl ProbeFs for HostFs {
    fn read(&self, path: &str) -> Option<String> {
        if let Some(dir) = &self.shadow {
            let shadowed = dir.join(path.trim_start_matches('/'));
            if let Ok(text) = std::fs::read_to_string(shadowed) {
                return Some(text);
            }
        }
        std::fs::read_to_string(path).ok()
    }
    /// Stops at the first other process: the kernel makes `cgroup.procs` as it is read, and a
    /// root cgroup (a hybrid host's `unified/`) can list every process of the machine (issue 22).
    fn lists_other_process(&self, path: &str, pid: u32) -> bool {
        use std::io::BufRead;
        if self.shadow.is_some() {
            return self.read(path).is_some_and(|t| other_pid_listed(t.lines(), pid));
        }
        let Ok(file) = std::fs::File::open(path) else { return false };
        other_pid_listed(
            std::io::BufReader::with_capacity(512, file).lines().map_while(Result::ok),
            pid,
        )
    }
    fn uid(&self) -> u32 {
        nix::unistd::geteuid().as_raw()
    }
    fn landlock_abi(&self) -> Option<u32> {
        crate::sys::exec::landlock_abi()
    }
    /// Writable by us; unprivileged, also owned by us (delegation is a `chown`, cgroup-v2.rst
    /// "Delegation": group- or world-writable cgroup files are not a delegation).
    fn writable(&self, path: &Path) -> bool {
        use std::os::unix::fs::MetadataExt;
        let uid = self.uid();
        nix::unistd::access(path, nix::unistd::AccessFlags::W_OK).is_ok()
            && (uid == 0 || std::fs::metadata(path).is_ok_and(|m| m.uid() == uid))
    }
}

/// State of one probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Warn,
    Fail,
}

/// One line of `airlock doctor`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ProbeLine {
    pub name: &'static str,
    pub status: Status,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

/// What the kernel offers the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kernel {
    pub uid: u32,
    pub max_user_namespaces: Option<u64>,
    /// Debian's `kernel.unprivileged_userns_clone` (absent elsewhere).
    pub unprivileged_userns_clone: Option<u64>,
    /// Ubuntu's `kernel.apparmor_restrict_unprivileged_userns`.
    pub apparmor_restrict: Option<u64>,
    /// Our AppArmor label (`/proc/self/attr/current`).
    pub apparmor_label: Option<String>,
    pub seccomp_filter: bool,
    pub landlock_abi: Option<u32>,
    /// A cgroup v2 directory we may create children in (our own cgroup).
    pub cgroup_delegated: Option<PathBuf>,
    /// That directory is the hierarchy's root (exempt from the no-internal-processes rule).
    pub cgroup_is_root: bool,
    /// Its `cgroup.controllers` and `cgroup.subtree_control`.
    pub cgroup_controllers: Vec<String>,
    pub cgroup_subtree: Vec<String>,
    /// Processes other than us are in it (listed in its `cgroup.procs`).
    pub cgroup_shared: bool,
}

fn num(fs: &dyn ProbeFs, path: &str) -> Option<u64> {
    fs.read(path).and_then(|t| t.trim().parse().ok())
}

/// Reads every probe.
pub fn probe(fs: &dyn ProbeFs) -> Kernel {
    let delegated = delegated_cgroup(fs);
    let words = |d: &Option<(PathBuf, bool)>, file: &str| -> Vec<String> {
        d.as_ref()
            .and_then(|(dir, _)| fs.read(&dir.join(file).to_string_lossy()))
            .map(|t| t.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default()
    };
    let status = fs.read("/proc/self/status").unwrap_or_default();
    Kernel {
        uid: fs.uid(),
        max_user_namespaces: num(fs, "/proc/sys/user/max_user_namespaces"),
        unprivileged_userns_clone: num(fs, "/proc/sys/kernel/unprivileged_userns_clone"),
        apparmor_restrict: num(fs, "/proc/sys/kernel/apparmor_restrict_unprivileged_userns"),
        apparmor_label: fs
            .read("/proc/self/attr/apparmor/current")
            .or_else(|| fs.read("/proc/self/attr/current"))
            .map(|s| s.trim_end_matches(['\n', '\0']).to_string()),
        seccomp_filter: status.lines().any(|l| l.starts_with("Seccomp_filters:"))
            || status.lines().any(|l| l.starts_with("Seccomp:")),
        landlock_abi: fs.landlock_abi(),
        cgroup_delegated: delegated.as_ref().map(|(dir, _)| dir.clone()),
        cgroup_is_root: delegated.as_ref().is_some_and(|(_, root)| *root),
        cgroup_controllers: words(&delegated, "cgroup.controllers"),
        cgroup_subtree: words(&delegated, "cgroup.subtree_control"),
        cgroup_shared: delegated.as_ref().is_some_and(|(dir, _)| {
            fs.lists_other_process(&dir.join("cgroup.procs").to_string_lossy(), fs.pid())
        }),
    }
}

/// The cgroup v2 directory of this process if we can create children there (and whether it
/// is the hierarchy's root). Unprivileged, it must be ours ([`ProbeFs::writable`]).
fn delegated_cgroup(fs: &dyn ProbeFs) -> Option<(PathBuf, bool)> {
    let cgroup = fs.read("/proc/self/cgroup")?;
    let rel = cgroup.lines().find_map(|l| l.strip_prefix("0::"))?.trim().to_string();
    let mountinfo = fs.read("/proc/self/mountinfo")?;
    let mount = mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        right.starts_with("cgroup2 ").then(|| left.split(' ').nth(4).map(PathBuf::from))?
    })?;
    let dir = mount.join(rel.trim_start_matches('/'));
    (fs.writable(&dir.join("cgroup.procs")) && fs.writable(&dir.join("cgroup.subtree_control")))
        .then_some((dir, rel == "/"))
}

impl Kernel {
    /// Problems that make the mandatory layers impossible, each with its fix.
    pub fn mandatory_problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.max_user_namespaces == Some(0) {
            out.push(
                "user namespaces are disabled (user.max_user_namespaces=0); fix: \
                 `sudo sysctl -w user.max_user_namespaces=15000`"
                    .to_string(),
            );
        }
        if self.uid != 0 && self.unprivileged_userns_clone == Some(0) {
            out.push(
                "unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone=0); \
                 fix: `sudo sysctl -w kernel.unprivileged_userns_clone=1`"
                    .to_string(),
            );
        }
        if self.apparmor_blocks() {
            out.push(APPARMOR_FIX.to_string());
        }
        if !self.seccomp_filter {
            out.push("the kernel has no seccomp filter support (CONFIG_SECCOMP_FILTER)".into());
        }
        out
    }

    /// Ubuntu's restriction applies to us: on, not root, and not running under our profile.
    pub fn apparmor_blocks(&self) -> bool {
        self.apparmor_restrict.is_some_and(|v| v != 0)
            && self.uid != 0
            && !self.apparmor_label.as_deref().is_some_and(|l| l.starts_with("airlock"))
    }

    /// Optional layers that are missing, each as one warning.
    pub fn optional_warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        match self.landlock_abi {
            None => out.push(
                "Landlock is not available: filesystem rules and scoping are not in force \
                 (needs Linux 5.13+ with landlock in the `lsm=` list)"
                    .to_string(),
            ),
            Some(abi) if abi < 6 => out.push(format!(
                "Landlock ABI {abi}: abstract-socket and signal scoping need ABI 6 (Linux 6.12+)"
            )),
            Some(_) => {}
        }
        out.extend(self.cgroup_warning());
        out
    }

    /// Why sessions get no cgroup limits (or only some), if they don't.
    pub fn cgroup_warning(&self) -> Option<String> {
        match &self.cgroup_delegated {
            None => Some(
                "no delegated cgroup v2 subtree: sessions run without pids.max/memory.max \
                 (only RLIMIT_NPROC and the tmpfs size limits); fix: run under a systemd user \
                 manager with delegation (`systemd-run --user -p Delegate=yes ...`)"
                    .to_string(),
            ),
            Some(dir) if self.unavailable_controllers().is_empty() && self.cgroup_blocked() => {
                Some(format!(
                    "cgroup v2 at {} holds other processes, so the pids and memory controllers \
                     cannot be enabled below it (cgroup v2's no-internal-processes rule): \
                     sessions get their own cgroup but no pids.max/memory.max; fix: start \
                     airlock in a cgroup of its own (`systemd-run --user --scope -p \
                     Delegate=yes airlock exec ...`)",
                    dir.display()
                ))
            }
            Some(dir) => cgroup::unavailable_warning(dir, &self.unavailable_controllers()),
        }
    }

    /// Controllers still have to be enabled in our own cgroup, but it is not the root and
    /// other processes live in it, so the kernel would refuse (`EBUSY`).
    pub fn cgroup_blocked(&self) -> bool {
        let enabled = |c: &str| self.cgroup_subtree.iter().any(|x| x == c);
        !self.cgroup_is_root
            && self.cgroup_shared
            && !cgroup::CONTROLLERS.iter().all(|c| enabled(c))
    }

    /// Wanted cgroup controllers our delegated cgroup does not offer.
    pub fn unavailable_controllers(&self) -> Vec<&'static str> {
        cgroup::CONTROLLERS
            .into_iter()
            .filter(|c| !self.cgroup_controllers.iter().any(|x| x == c))
            .collect()
    }

    /// The optional layers in force, as recorded in the session record.
    pub fn optional_layers(&self) -> Vec<String> {
        let mut v = Vec::new();
        if let Some(abi) = self.landlock_abi {
            v.push(format!("landlock-fs(abi {abi})"));
            if abi >= 6 {
                v.push("landlock-scope".into());
            }
        }
        // cgroup layers are added by the supervisor from what it actually applied.
        v
    }
}

/// The mandatory layers (always in force when a session runs).
pub const MANDATORY_LAYERS: &[&str] = &[
    "userns",
    "mountns",
    "netns",
    "pidns",
    "utsns",
    "ipcns",
    "no_new_privs",
    "caps-dropped",
    "seccomp",
];

/// `airlock doctor`'s kernel section.
pub fn report(fs: &dyn ProbeFs) -> Vec<ProbeLine> {
    let k = probe(fs);
    let mut lines = Vec::new();
    let userns_problems: Vec<String> = k
        .mandatory_problems()
        .into_iter()
        .filter(|p| !p.contains("seccomp") && !p.contains("apparmor"))
        .collect();
    lines.push(ProbeLine {
        name: "user namespaces",
        status: if userns_problems.is_empty() { Status::Ok } else { Status::Fail },
        detail: match k.max_user_namespaces {
            Some(n) => format!("user.max_user_namespaces={n}"),
            None => "available".into(),
        },
        fix: (!userns_problems.is_empty()).then(|| userns_problems.join("; ")),
    });
    lines.push(ProbeLine {
        name: "apparmor userns restriction",
        status: if k.apparmor_blocks() { Status::Fail } else { Status::Ok },
        detail: match k.apparmor_restrict {
            Some(v) => format!("kernel.apparmor_restrict_unprivileged_userns={v}"),
            None => "not present".into(),
        },
        fix: k.apparmor_blocks().then(|| APPARMOR_FIX.to_string()),
    });
    lines.push(ProbeLine {
        name: "seccomp",
        status: if k.seccomp_filter { Status::Ok } else { Status::Fail },
        detail: if k.seccomp_filter { "filter mode available".into() } else { "missing".into() },
        fix: None,
    });
    lines.push(ProbeLine {
        name: "landlock",
        status: match k.landlock_abi {
            Some(abi) if abi >= 6 => Status::Ok,
            _ => Status::Warn,
        },
        detail: match k.landlock_abi {
            Some(abi) => format!("ABI {abi}"),
            None => "not available".into(),
        },
        fix: k.optional_warnings().into_iter().find(|w| w.starts_with("Landlock")),
    });
    let cgroup_warning = k.cgroup_warning();
    lines.push(ProbeLine {
        name: "cgroup v2 delegation",
        status: if cgroup_warning.is_none() { Status::Ok } else { Status::Warn },
        detail: match &k.cgroup_delegated {
            Some(dir) if cgroup_warning.is_none() => format!(
                "delegated: {}; each session gets its own cgroup with pids.max and memory.max",
                dir.display()
            ),
            Some(dir) if k.unavailable_controllers().is_empty() => format!(
                "delegated: {}, but it holds other processes; each session gets its own \
                 cgroup, limits not applied",
                dir.display(),
            ),
            Some(dir) => format!(
                "delegated: {}, but without the {} controller(s); each session gets its own \
                 cgroup, limits not applied",
                dir.display(),
                k.unavailable_controllers().join(", ")
            ),
            None => "no delegated cgroup v2 slice; only RLIMIT_NPROC and /tmp size limit".into(),
        },
        fix: cgroup_warning.is_some().then(|| match &k.cgroup_delegated {
            None => "run under a systemd user manager with delegation \
                     (`systemd-run --user -p Delegate=yes ...`)"
                .to_string(),
            Some(_) if k.unavailable_controllers().is_empty() => {
                "start airlock in a cgroup of its own \
                 (`systemd-run --user --scope -p Delegate=yes airlock exec ...`)"
                    .to_string()
            }
            Some(_) => "boot with the unified cgroup hierarchy \
                        (`systemd.unified_cgroup_hierarchy=1`) so pids and memory are cgroup v2 \
                        controllers"
                .to_string(),
        }),
    });
    lines
}

/// The hidden subcommand that runs [`capture_probe_child`].
pub const CAPTURE_PROBE_COMMAND: &str = "__probe-capture";

/// Transparent capture (issue 14): whether the capture `exec` puts in place inside the
/// sandbox's network namespace works on this machine. Tried for real, in a throwaway user and
/// network namespace (a fresh `airlock __probe-capture` process, single-threaded as clone(2)
/// with CLONE_NEWUSER requires), because no file in /proc says whether nf_tables' nat chains
/// and redir expression are usable there. The IPv6 half is judged apart: without it (a kernel
/// or namespace without IPv6) sessions still start, with IPv4 captured, so it is a warning.
pub fn capture_line() -> ProbeLine {
    let name = "transparent capture";
    let fix = "a kernel with nf_tables NAT (CONFIG_NF_TABLES, CONFIG_NF_TABLES_INET, \
CONFIG_NFT_NAT, CONFIG_NFT_REDIR, CONFIG_NF_CONNTRACK; for UDP refusals CONFIG_NFT_LOG, \
CONFIG_NFT_REJECT, CONFIG_NFT_REJECT_INET, CONFIG_NETFILTER_NETLINK_LOG) and user namespaces; \
without it `airlock exec` refuses to start (exit 125)";
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            return ProbeLine {
                name,
                status: Status::Warn,
                detail: format!("cannot probe: cannot find the airlock binary: {e}"),
                fix: None,
            };
        }
    };
    match std::process::Command::new(exe).arg(CAPTURE_PROBE_COMMAND).output() {
        Ok(out) if out.status.success() => ProbeLine {
            name,
            status: Status::Ok,
            detail: "TCP to any non-loopback address, IPv4 and IPv6, is redirected to the \
capture listener (nftables redirect, set up through netlink); UDP to it is refused and reported \
on the netfilter log socket (nftables log + reject)"
                .into(),
            fix: None,
        },
        Ok(out) if out.status.code() == Some(CAPTURE_PROBE_NO_V6) => ProbeLine {
            name,
            status: Status::Warn,
            detail: format!(
                "IPv4 TCP to any non-loopback address is redirected to the capture listener \
and IPv4 UDP to it is refused and reported; IPv6 is not: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            fix: Some(
                "sessions start, but IPv6 connections inside the sandbox fail (ENETUNREACH or \
EADDRNOTAVAIL) and leave no audit line; to capture them, run a kernel with IPv6 (not booted with \
ipv6.disable=1, net.ipv6.conf.default.disable_ipv6=0) and IPv6 NAT in nf_tables"
                    .into(),
            ),
        },
        Ok(out) => ProbeLine {
            name,
            status: Status::Fail,
            detail: format!("unavailable: {}", String::from_utf8_lossy(&out.stderr).trim()),
            fix: Some(fix.into()),
        },
        Err(e) => ProbeLine {
            name,
            status: Status::Warn,
            detail: format!("cannot probe: cannot run the airlock binary: {e}"),
            fix: None,
        },
    }
}

/// The UDP half of the capture probe, in the throwaway namespace after the TCP capture: the
/// refusal rule and the log socket exactly as the sandbox makes them, then one datagram to a
/// non-loopback address (it cannot leave: the namespace has only `lo`), which must be
/// refused at once and reported on the log socket with its destination. Returns the log
/// socket for the IPv6 half ([`udp_refused_and_logged`] again).
fn udp_refusal_probe() -> Result<std::os::fd::OwnedFd, String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    crate::sys::nflog::install_udp_refusal().map_err(|e| err(&e))?;
    let log = crate::sys::nflog::open_udp_log().map_err(|e| err(&e))?;
    let timeout = nix::sys::time::TimeVal::new(2, 0);
    nix::sys::socket::setsockopt(&log, nix::sys::socket::sockopt::ReceiveTimeout, &timeout)
        .map_err(|e| format!("SO_RCVTIMEO on the log socket: {e}"))?;
    udp_refused_and_logged(&log, ([192, 0, 2, 1], 443).into())?;
    Ok(log)
}

/// One datagram to `probe` (a documentation address, RFC 5737 / RFC 3849) is refused at once
/// and reported on `log` with its destination.
fn udp_refused_and_logged(
    log: &std::os::fd::OwnedFd,
    probe: std::net::SocketAddr,
) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let local: std::net::SocketAddr = if probe.is_ipv6() {
        (std::net::Ipv6Addr::LOCALHOST, 0).into()
    } else {
        (std::net::Ipv4Addr::LOCALHOST, 0).into()
    };
    let udp = std::net::UdpSocket::bind(local).map_err(|e| e.to_string())?;
    if udp.send_to(b"airlock probe", probe).is_ok() {
        return Err(format!(
            "a UDP datagram to {probe} was not refused (the reject rule is not in force)"
        ));
    }
    let mut buf = vec![0u8; 8192];
    let n = nix::sys::socket::recv(log.as_raw_fd(), &mut buf, nix::sys::socket::MsgFlags::empty())
        .map_err(|e| format!("no netfilter log message for a refused UDP datagram: {e}"))?;
    match crate::sys::nflog::parse(&buf[..n]).into_iter().next() {
        Some(Ok(l)) if l.dst == probe => Ok(()),
        other => Err(format!("the netfilter log reported {other:?}, not the datagram to {probe}")),
    }
}

/// Exit code of `airlock __probe-capture` when the IPv4 capture works and the IPv6 one does not.
pub const CAPTURE_PROBE_NO_V6: i32 = 2;

/// `airlock __probe-capture`: in a child in new user and network namespaces, map our ids,
/// bring `lo` up and install the capture exactly as the sandbox does (TCP redirect, UDP
/// refusal and its log socket, [`udp_refusal_probe`]), IPv6 listener and IPv6 UDP refusal
/// included. Exit 0 when it all worked; [`CAPTURE_PROBE_NO_V6`] with the IPv6 reason on stderr
/// when only IPv4 did; otherwise 1 with the reason on stderr.
pub fn capture_probe_child() -> i32 {
    use crate::sys::namespaces::{self, Forked};
    let uid = nix::unistd::geteuid().as_raw();
    let gid = nix::unistd::getegid().as_raw();
    match namespaces::fork_into_namespaces(libc::CLONE_NEWUSER | libc::CLONE_NEWNET) {
        Ok(Forked::Child) => {
            let r = super::inside::write_id_maps(uid, gid)
                .and_then(|()| {
                    // As in the sandbox: after the id maps, before `lo` is up.
                    #[cfg(feature = "test-hooks")]
                    crate::sys::netfilter::test_hook_disable_ipv6();
                    namespaces::loopback_up()
                })
                .map_err(|e| e.to_string())
                .and_then(|()| {
                    crate::sys::netfilter::install_capture(super::inside::CAPTURE_PORT)
                        .map_err(|e| e.to_string())
                })
                .and_then(|()| udp_refusal_probe());
            let v6 = |log: std::os::fd::OwnedFd| {
                crate::sys::nflog::install_udp_refusal_v6()
                    .and_then(|()| {
                        crate::sys::netfilter::install_capture_v6(super::inside::CAPTURE_PORT)
                    })
                    .map_err(|e| e.to_string())
                    .and_then(|()| {
                        super::inside::handover_socket(crate::sys::fdpass::SocketKind::CaptureTcp6)
                            .map(drop)
                            .map_err(|e| e.to_string())
                    })
                    .and_then(|()| {
                        udp_refused_and_logged(
                            &log,
                            ([0x2001, 0xdb8, 0, 0, 0, 0, 0, 1], 443).into(),
                        )
                    })
            };
            match r.map(v6) {
                Ok(Ok(())) => crate::sys::exec::exit_now(0),
                Ok(Err(e)) => {
                    eprintln!("{e}");
                    crate::sys::exec::exit_now(CAPTURE_PROBE_NO_V6)
                }
                Err(e) => {
                    eprintln!("{e}");
                    crate::sys::exec::exit_now(1)
                }
            }
        }
        Ok(Forked::Parent(pid)) => match nix::sys::wait::waitpid(pid, None) {
            Ok(nix::sys::wait::WaitStatus::Exited(_, code)) => code,
            Ok(other) => {
                eprintln!("the probe ended with {other:?}");
                1
            }
            Err(e) => {
                eprintln!("waiting for the probe: {e}");
                1
            }
        },
        Err(e) => {
            eprintln!("cannot enter new user and network namespaces: {e}");
            1
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct Fake {
        files: HashMap<&'static str, &'static str>,
        uid: u32,
        abi: Option<u32>,
    }
    impl ProbeFs for Fake {
        fn read(&self, path: &str) -> Option<String> {
            self.files.get(path).map(|s| s.to_string())
        }
        fn uid(&self) -> u32 {
            self.uid
        }
        fn landlock_abi(&self) -> Option<u32> {
            self.abi
        }
        fn writable(&self, path: &Path) -> bool {
            path.starts_with("/sys/fs/cgroup/user.slice")
        }
    }

    fn ubuntu(uid: u32, label: &'static str) -> Fake {
        Fake {
            files: HashMap::from([
                ("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1\n"),
                ("/proc/self/attr/current", label),
                ("/proc/self/status", "Seccomp:\t0\nSeccomp_filters:\t0\n"),
            ]),
            uid,
            abi: Some(4),
        }
    }

    #[test]
    fn apparmor_restriction_is_detected_with_the_fix() {
        let k = probe(&ubuntu(1000, "unconfined\n"));
        let problems = k.mandatory_problems();
        assert_eq!(problems.len(), 1);
        assert!(problems[0].contains("contrib/apparmor/airlock"));
        let lines = report(&ubuntu(1000, "unconfined\n"));
        assert!(
            lines
                .iter()
                .any(|l| l.name == "apparmor userns restriction" && l.status == Status::Fail)
        );
        // Under our profile, or as root, it does not apply.
        assert!(probe(&ubuntu(1000, "airlock (unconfined)\n")).mandatory_problems().is_empty());
        assert!(probe(&ubuntu(0, "unconfined\n")).mandatory_problems().is_empty());
    }

    #[test]
    fn landlock_below_six_warns_about_scoping() {
        let k = probe(&ubuntu(0, "unconfined"));
        assert!(k.optional_warnings()[0].contains("ABI 4"));
        assert_eq!(k.optional_layers(), vec!["landlock-fs(abi 4)".to_string()]);
    }

    #[test]
    fn disabled_userns_and_missing_seccomp_are_mandatory_failures() {
        let fake = Fake {
            files: HashMap::from([
                ("/proc/sys/user/max_user_namespaces", "0"),
                ("/proc/sys/kernel/unprivileged_userns_clone", "0"),
                ("/proc/self/status", "Name:\tx\n"),
            ]),
            uid: 1000,
            abi: None,
        };
        let problems = probe(&fake).mandatory_problems();
        assert_eq!(problems.len(), 3, "{problems:?}");
    }

    #[test]
    fn delegated_cgroup_is_found_from_mountinfo() {
        let fake = Fake {
            files: HashMap::from([
                ("/proc/self/cgroup", "0::/user.slice/user-1000.slice/session.scope\n"),
                (
                    "/proc/self/mountinfo",
                    "30 1 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n",
                ),
                (
                    "/sys/fs/cgroup/user.slice/user-1000.slice/session.scope/cgroup.controllers",
                    "cpu memory pids\n",
                ),
            ]),
            uid: 1000,
            abi: Some(6),
        };
        let k = probe(&fake);
        assert_eq!(
            k.cgroup_delegated,
            Some(PathBuf::from("/sys/fs/cgroup/user.slice/user-1000.slice/session.scope"))
        );
        assert!(!k.cgroup_is_root);
        assert_eq!(k.cgroup_controllers, ["cpu", "memory", "pids"].map(String::from));
        assert_eq!(k.cgroup_warning(), None);
        let line = report(&fake).into_iter().find(|l| l.name == "cgroup v2 delegation").unwrap();
        assert_eq!(line.status, Status::Ok, "{line:?}");
    }

    #[test]
    fn a_delegated_cgroup_shared_with_other_processes_cannot_get_limits() {
        let mut fake = Fake {
            files: HashMap::from([
                ("/proc/self/cgroup", "0::/user.slice/app.scope\n"),
                ("/proc/self/mountinfo", "30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"),
                ("/sys/fs/cgroup/user.slice/app.scope/cgroup.controllers", "memory pids\n"),
                ("/sys/fs/cgroup/user.slice/app.scope/cgroup.procs", "1\n"),
            ]),
            uid: 1000,
            abi: Some(6),
        };
        let k = probe(&fake);
        assert!(k.cgroup_shared && k.cgroup_blocked());
        assert!(k.cgroup_warning().unwrap().contains("holds other processes"));
        let line = report(&fake).into_iter().find(|l| l.name == "cgroup v2 delegation").unwrap();
        assert_eq!(line.status, Status::Warn);
        // Once the controllers are enabled (a previous session moved out), nothing blocks.
        fake.files
            .insert("/sys/fs/cgroup/user.slice/app.scope/cgroup.subtree_control", "memory pids\n");
        assert_eq!(probe(&fake).cgroup_warning(), None);
    }

    #[test]
    fn hybrid_cgroup_without_controllers_is_a_warning() {
        let fake = Fake {
            files: HashMap::from([
                ("/proc/self/cgroup", "4:memory:/x\n0::/\n"),
                (
                    "/proc/self/mountinfo",
                    "30 1 0:26 / /sys/fs/cgroup/user.slice rw - cgroup2 cgroup2 rw\n",
                ),
                ("/sys/fs/cgroup/user.slice/cgroup.controllers", "hugetlb\n"),
            ]),
            uid: 0,
            abi: Some(6),
        };
        let k = probe(&fake);
        assert!(k.cgroup_is_root);
        assert_eq!(k.unavailable_controllers(), vec!["pids", "memory"]);
        assert!(k.optional_warnings()[0].contains("pids, memory"), "{:?}", k.optional_warnings());
        let line = report(&fake).into_iter().find(|l| l.name == "cgroup v2 delegation").unwrap();
        assert_eq!(line.status, Status::Warn);
        assert!(line.detail.contains("limits not applied"), "{line:?}");
        let landlock = report(&fake).into_iter().find(|l| l.name == "landlock").unwrap();
        assert_eq!(landlock.fix, None);
    }
}
