//! Kernel probes: what the sandbox can put in force on this machine. The same module decides
//! what `exec` refuses over (mandatory layers), what it warns about (optional ones) and what
//! `airlock doctor` shows ([`report`]). Reads go through [`ProbeFs`] so tests (and CI, through
//! the `test-hooks` override) can present e.g. Ubuntu's AppArmor restriction.

use std::path::{Path, PathBuf};

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
    fn uid(&self) -> u32 {
        nix::unistd::geteuid().as_raw()
    }
    fn landlock_abi(&self) -> Option<u32> {
        crate::sys::exec::landlock_abi()
    }
    fn writable(&self, path: &Path) -> bool {
        nix::unistd::access(path, nix::unistd::AccessFlags::W_OK).is_ok()
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
    /// A cgroup v2 directory we may create children in.
    pub cgroup_delegated: Option<PathBuf>,
}

fn num(fs: &dyn ProbeFs, path: &str) -> Option<u64> {
    fs.read(path).and_then(|t| t.trim().parse().ok())
}

/// Reads every probe.
pub fn probe(fs: &dyn ProbeFs) -> Kernel {
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
        cgroup_delegated: delegated_cgroup(fs),
    }
}

/// The cgroup v2 directory of this process if we can create children there.
fn delegated_cgroup(fs: &dyn ProbeFs) -> Option<PathBuf> {
    let cgroup = fs.read("/proc/self/cgroup")?;
    let rel = cgroup.lines().find_map(|l| l.strip_prefix("0::"))?.trim().to_string();
    let mountinfo = fs.read("/proc/self/mountinfo")?;
    let mount = mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        right.starts_with("cgroup2 ").then(|| left.split(' ').nth(4).map(PathBuf::from))?
    })?;
    let dir = mount.join(rel.trim_start_matches('/'));
    (fs.writable(&dir.join("cgroup.procs")) && fs.writable(&dir.join("cgroup.subtree_control")))
        .then_some(dir)
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
        out
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
        if self.cgroup_delegated.is_some() {
            v.push("cgroup".into());
        }
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
        fix: k.optional_warnings().first().cloned(),
    });
    lines.push(ProbeLine {
        name: "cgroup v2 delegation",
        status: if k.cgroup_delegated.is_some() { Status::Ok } else { Status::Warn },
        detail: match &k.cgroup_delegated {
            Some(dir) => format!("delegated: {}", dir.display()),
            None => "no delegated cgroup v2 slice; only RLIMIT_NPROC and /tmp size limit".into(),
        },
        fix: k.cgroup_delegated.is_none().then(|| {
            "run under a systemd user manager with delegation (`systemd-run --user -p Delegate=yes`)"
                .to_string()
        }),
    });
    lines
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
            ]),
            uid: 1000,
            abi: Some(6),
        };
        assert_eq!(
            probe(&fake).cgroup_delegated,
            Some(PathBuf::from("/sys/fs/cgroup/user.slice/user-1000.slice/session.scope"))
        );
    }
}
