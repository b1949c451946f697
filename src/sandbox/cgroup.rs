//! The per-session cgroup v2 leaf (SECURITY §4 "cgroup v2 limits where a delegated slice
//! exists"). When the probe found a cgroup v2 directory we may write to (our own cgroup), each
//! session gets `<own>/airlock-<session>` with `pids.max` and `memory.max`; the sandbox's init
//! is born in it (clone3 `CLONE_INTO_CGROUP`) and makes it the root of its cgroup namespace.
//! The leaf is removed when the session ends.
//!
//! cgroup v2's no-internal-processes rule (Documentation/admin-guide/cgroup-v2.rst, "No
//! Internal Process Constraint"): a non-root cgroup with controllers enabled in
//! `cgroup.subtree_control` cannot hold processes, so before enabling `pids`/`memory` in our own
//! cgroup the supervisor moves itself into the sibling leaf `<own>/airlock-supervisor`. The
//! planning is pure ([`plan`]); [`apply`] performs it.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::env::Env;

/// `pids.max` of a session unless overridden.
pub const DEFAULT_PIDS_MAX: u64 = 4096;
/// `memory.max` of a session: 8 GiB ([`Limits::from_env`] lowers it to half of `MemTotal`).
pub const DEFAULT_MEMORY_MAX: u64 = 8 << 30;
/// Test-only (`test-hooks`): a lower `pids.max`, so a test can reach it.
pub const TEST_PIDS_MAX_VAR: &str = "AIRLOCK_TEST_PIDS_MAX";
/// The sibling leaf the supervisor moves into (shared by concurrent sessions, never removed).
pub const SUPERVISOR_LEAF: &str = "airlock-supervisor";
/// The controllers a session's limits need.
pub const CONTROLLERS: [&str; 2] = ["pids", "memory"];

/// What a session's cgroup is limited to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub pids_max: u64,
    pub memory_max: u64,
}

impl Limits {
    /// The defaults, with `memory.max` capped at half of `MemTotal`; with `test-hooks`,
    /// [`TEST_PIDS_MAX_VAR`] lowers `pids.max`.
    pub fn from_env(env: &dyn Env) -> Self {
        let half_ram =
            fs::read_to_string("/proc/meminfo").ok().and_then(|m| mem_total(&m)).unwrap_or(0) / 2;
        let memory_max =
            if half_ram > 0 { DEFAULT_MEMORY_MAX.min(half_ram) } else { DEFAULT_MEMORY_MAX };
        #[cfg(feature = "test-hooks")]
        if let Some(pids_max) = env.var(TEST_PIDS_MAX_VAR).and_then(|v| v.parse().ok()) {
            return Self { pids_max, memory_max };
        }
        let _ = env;
        Self { pids_max: DEFAULT_PIDS_MAX, memory_max }
    }
}

/// `MemTotal` in bytes from `/proc/meminfo` text (0 if absent).
fn mem_total(meminfo: &str) -> Option<u64> {
    meminfo.lines().find_map(|l| {
        let kb = l.strip_prefix("MemTotal:")?.trim().strip_suffix("kB")?.trim();
        kb.parse::<u64>().ok().map(|k| k * 1024)
    })
}

/// The steps for one session, decided from the probe's view of our own cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Our own cgroup (the delegated directory).
    pub parent: PathBuf,
    /// `<parent>/airlock-<session>`.
    pub leaf: PathBuf,
    /// `<parent>/airlock-supervisor`.
    pub supervisor_leaf: PathBuf,
    /// Move the supervisor out before enabling controllers (non-root cgroup).
    pub move_supervisor_first: bool,
    /// Controllers to add to `<parent>/cgroup.subtree_control`.
    pub enable: Vec<&'static str>,
    /// `(file, value)` written into the leaf.
    pub limits: Vec<(&'static str, String)>,
    /// Wanted controllers the parent does not offer (no limit for them).
    pub unavailable: Vec<&'static str>,
}

/// Plans the session leaf. `is_root`: `parent` is the hierarchy's root (exempt from the
/// no-internal-processes rule); `controllers`/`subtree`: the parent's `cgroup.controllers` and
/// `cgroup.subtree_control`.
pub fn plan(
    parent: &Path,
    is_root: bool,
    controllers: &[String],
    subtree: &[String],
    session: &str,
    limits: &Limits,
) -> Plan {
    let has = |list: &[String], c: &str| list.iter().any(|x| x == c);
    let available: Vec<&'static str> =
        CONTROLLERS.into_iter().filter(|c| has(controllers, c)).collect();
    let enable: Vec<&'static str> =
        available.iter().copied().filter(|c| !has(subtree, c)).collect();
    let limits = available
        .iter()
        .map(|c| match *c {
            "pids" => ("pids.max", limits.pids_max.to_string()),
            _ => ("memory.max", limits.memory_max.to_string()),
        })
        .collect();
    Plan {
        parent: parent.to_path_buf(),
        leaf: parent.join(format!("airlock-{session}")),
        supervisor_leaf: parent.join(SUPERVISOR_LEAF),
        move_supervisor_first: !enable.is_empty() && !is_root,
        enable,
        limits,
        unavailable: CONTROLLERS.into_iter().filter(|c| !has(controllers, c)).collect(),
    }
}

/// The warning for controllers our cgroup does not offer (shared with the probe/`doctor`).
pub fn unavailable_warning(parent: &Path, unavailable: &[&str]) -> Option<String> {
    (!unavailable.is_empty()).then(|| {
        let what: Vec<String> = unavailable.iter().map(|c| format!("{c}.max")).collect();
        format!(
            "cgroup v2 at {} does not offer the {} controller(s) (on a hybrid v1/v2 host they \
             are bound to cgroup v1): sessions get their own cgroup but no {}; fix: boot with \
             the unified hierarchy (systemd.unified_cgroup_hierarchy=1) or delegate them",
            parent.display(),
            unavailable.join(", "),
            what.join("/"),
        )
    })
}

/// A step of [`apply`] that failed.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cannot move the supervisor into {path}: {source}")]
    MoveSupervisor {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot enable the {controllers} controller(s) in {path}: {source}")]
    Enable {
        controllers: String,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot create the session cgroup {path}: {source}")]
    Create {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot set {file}={value} in {path}: {source}")]
    Limit {
        file: &'static str,
        value: String,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot remove the session cgroup {path}: {source}")]
    Remove {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// A session's cgroup, removed on drop (or explicitly with [`Leaf::remove`]).
#[derive(Debug)]
pub struct Leaf {
    path: PathBuf,
    dir: Option<File>,
    /// The process that made it: only it removes it (the sandbox's init holds a copy after
    /// the fork and must never try, even if it unwinds).
    owner: u32,
    /// Layers in force, e.g. `cgroup`, `cgroup-pids(4096)`.
    pub layers: Vec<String>,
    /// What could not be applied, one line each.
    pub warnings: Vec<String>,
}

fn move_self(dir: &Path) -> Result<(), CgroupError> {
    let err = |source| CgroupError::MoveSupervisor { path: dir.to_path_buf(), source };
    match fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(err(e)),
    }
    // "0" is the writing process itself (cgroup-v2.rst, cgroup.procs).
    fs::write(dir.join("cgroup.procs"), "0").map_err(err)
}

fn enable(plan: &Plan) -> Result<(), CgroupError> {
    let text: Vec<String> = plan.enable.iter().map(|c| format!("+{c}")).collect();
    let write = || fs::write(plan.parent.join("cgroup.subtree_control"), text.join(" "));
    let mut moved = false;
    if plan.move_supervisor_first {
        move_self(&plan.supervisor_leaf)?;
        moved = true;
    }
    let result = match write() {
        // EBUSY: processes in our own cgroup (e.g. a cgroup namespace's root that is not the
        // hierarchy's root). Move out and retry once.
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) && !moved => {
            move_self(&plan.supervisor_leaf)?;
            write()
        }
        other => other,
    };
    result.map_err(|source| CgroupError::Enable {
        controllers: plan.enable.join(", "),
        path: plan.parent.clone(),
        source,
    })
}

/// Performs `plan`: controllers (a failure there only loses the limits, reported in
/// `warnings`), the leaf, its limits. The returned [`Leaf`] removes the directory on drop.
pub fn apply(plan: &Plan) -> Result<Leaf, CgroupError> {
    let mut warnings = Vec::new();
    let mut limits_ok = true;
    if !plan.enable.is_empty()
        && let Err(e) = enable(plan)
    {
        warnings.push(format!("{e}; pids.max/memory.max not applied"));
        limits_ok = false;
    }
    fs::create_dir(&plan.leaf)
        .map_err(|source| CgroupError::Create { path: plan.leaf.clone(), source })?;
    let mut leaf = Leaf {
        path: plan.leaf.clone(),
        dir: None,
        owner: std::process::id(),
        layers: vec!["cgroup".into()],
        warnings,
    };
    if limits_ok {
        for (file, value) in &plan.limits {
            fs::write(plan.leaf.join(file), value).map_err(|source| CgroupError::Limit {
                file,
                value: value.clone(),
                path: plan.leaf.clone(),
                source,
            })?;
            let name = file.trim_end_matches(".max");
            leaf.layers.push(format!("cgroup-{name}({value})"));
        }
    }
    let dir = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(&plan.leaf)
        .map_err(|source| CgroupError::Create { path: plan.leaf.clone(), source })?;
    leaf.dir = Some(dir);
    Ok(leaf)
}

impl Leaf {
    /// The leaf's directory (for clone3 `CLONE_INTO_CGROUP`).
    pub fn dir_fd(&self) -> Option<BorrowedFd<'_>> {
        self.dir.as_ref().map(|d| d.as_fd())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Kills everything in the leaf (`cgroup.kill`, Linux 5.14+; best effort), leaving it in
    /// place: the backstop before the end-of-session sweep when init reported the command's end
    /// before its own exit.
    pub fn kill_all(&self) {
        if self.ours() {
            let _ = fs::write(self.path.join("cgroup.kill"), "1");
        }
    }

    /// Whether this process made the leaf and it is still there to act on (a fork's copy, or
    /// a leaf already removed, is not).
    fn ours(&self) -> bool {
        !self.path.as_os_str().is_empty() && self.owner == std::process::id()
    }

    /// Kills anything left in the leaf (`cgroup.kill`, Linux 5.14+) and removes it, waiting
    /// briefly for exiting tasks to leave (rmdir fails with `EBUSY` while it is populated).
    pub fn remove(mut self) -> Result<(), CgroupError> {
        self.remove_dir()
    }

    fn remove_dir(&mut self) -> Result<(), CgroupError> {
        self.dir = None;
        if !self.ours() {
            return Ok(());
        }
        self.kill_all();
        let mut tries = 0;
        let result = loop {
            match fs::remove_dir(&self.path) {
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) && tries < 200 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => break Ok(()),
                other => break other,
            }
        };
        let path = std::mem::take(&mut self.path);
        result.map_err(|source| CgroupError::Remove { path, source })
    }
}

impl Drop for Leaf {
    fn drop(&mut self) {
        let _ = self.remove_dir();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn v(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    const LIMITS: Limits = Limits { pids_max: 20, memory_max: 1 << 30 };

    #[test]
    fn delegated_subtree_moves_the_supervisor_out_before_enabling() {
        let dir = Path::new("/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app");
        let p = plan(dir, false, &v(&["cpu", "memory", "pids"]), &[], "abc", &LIMITS);
        assert_eq!(p.leaf, dir.join("airlock-abc"));
        assert_eq!(p.supervisor_leaf, dir.join("airlock-supervisor"));
        assert!(p.move_supervisor_first);
        assert_eq!(p.enable, vec!["pids", "memory"]);
        assert_eq!(
            p.limits,
            vec![("pids.max", "20".to_string()), ("memory.max", (1u64 << 30).to_string())]
        );
        assert!(p.unavailable.is_empty());
        assert_eq!(unavailable_warning(dir, &p.unavailable), None);
    }

    #[test]
    fn already_enabled_controllers_need_no_move() {
        let dir = Path::new("/sys/fs/cgroup/x");
        let p = plan(dir, false, &v(&["memory", "pids"]), &v(&["pids", "memory"]), "s", &LIMITS);
        assert!(p.enable.is_empty());
        assert!(!p.move_supervisor_first);
        assert_eq!(p.limits.len(), 2);
    }

    #[test]
    fn the_root_cgroup_is_exempt_from_the_internal_process_rule() {
        let p = plan(Path::new("/sys/fs/cgroup"), true, &v(&["pids", "memory"]), &[], "s", &LIMITS);
        assert_eq!(p.enable, vec!["pids", "memory"]);
        assert!(!p.move_supervisor_first);
    }

    #[test]
    fn hybrid_hosts_get_a_leaf_without_limits_and_a_warning() {
        // This machine's shape: cgroup2 at /sys/fs/cgroup/unified offering only hugetlb.
        let dir = Path::new("/sys/fs/cgroup/unified");
        let p = plan(dir, true, &v(&["hugetlb"]), &[], "s", &LIMITS);
        assert!(p.enable.is_empty() && p.limits.is_empty() && !p.move_supervisor_first);
        assert_eq!(p.unavailable, vec!["pids", "memory"]);
        let w = unavailable_warning(dir, &p.unavailable).unwrap();
        assert!(w.contains("/sys/fs/cgroup/unified") && w.contains("pids.max/memory.max"), "{w}");
        // Only one of the two: only that limit.
        let p = plan(dir, true, &v(&["pids"]), &v(&["pids"]), "s", &LIMITS);
        assert_eq!(p.limits, vec![("pids.max", "20".to_string())]);
        assert_eq!(p.unavailable, vec!["memory"]);
    }

    /// [`apply`] on a plain directory standing in for cgroupfs (the kernel's side is covered
    /// by `tests/it/sandbox.rs` where the host delegates pids/memory): the order of writes and
    /// what each file receives.
    #[test]
    fn apply_moves_out_enables_limits_and_opens_the_leaf() {
        let tmp = tempfile::tempdir().unwrap();
        let parent = tmp.path();
        let p = plan(parent, false, &v(&["memory", "pids"]), &[], "sess", &LIMITS);
        let leaf = apply(&p).unwrap();
        let read = |rel: &str| fs::read_to_string(parent.join(rel)).unwrap();
        assert_eq!(read("airlock-supervisor/cgroup.procs"), "0");
        assert_eq!(read("cgroup.subtree_control"), "+pids +memory");
        assert_eq!(read("airlock-sess/pids.max"), "20");
        assert_eq!(read("airlock-sess/memory.max"), (1u64 << 30).to_string());
        assert!(leaf.dir_fd().is_some());
        assert_eq!(leaf.path(), parent.join("airlock-sess"));
        assert_eq!(leaf.layers, vec!["cgroup", "cgroup-pids(20)", "cgroup-memory(1073741824)"]);
        assert!(leaf.warnings.is_empty());
        // cgroupfs lets rmdir remove a cgroup with its interface files; a plain directory
        // does not, so empty it first.
        for f in ["pids.max", "memory.max"] {
            fs::remove_file(parent.join("airlock-sess").join(f)).unwrap();
        }
        let leaf_path = leaf.path().to_path_buf();
        let cleanup = leaf.remove();
        // `cgroup.kill` was written (a regular file here), so this first attempt fails...
        assert!(matches!(cleanup, Err(CgroupError::Remove { .. })), "{cleanup:?}");
        assert!(leaf_path.join("cgroup.kill").exists());
    }

    #[test]
    fn an_existing_leaf_is_an_error_and_left_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let p = plan(tmp.path(), true, &v(&["hugetlb"]), &[], "dup", &LIMITS);
        fs::create_dir(&p.leaf).unwrap();
        let err = apply(&p).unwrap_err();
        assert!(err.to_string().contains("cannot create the session cgroup"), "{err}");
        assert!(p.leaf.is_dir());
    }

    #[test]
    fn mem_total_parses_meminfo() {
        assert_eq!(mem_total("MemTotal:       16384 kB\nMemFree: 1 kB\n"), Some(16384 * 1024));
        assert_eq!(mem_total("nothing"), None);
    }
}
