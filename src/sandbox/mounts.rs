//! The sandbox's filesystem (SECURITY §4): a plan computed on the host side as plain data (so
//! it is unit-tested without privileges), then carried out inside the new mount namespace.
//!
//! Execution follows bubblewrap's sequence: make every mount private, put a tmpfs on `/tmp`,
//! `pivot_root` into it (the host tree is then `/oldroot`), build the new root under
//! `/newroot`, detach `/oldroot`, and pivot into `/newroot`. Host-side sources inside the repo
//! are opened with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` and mounted through their
//! `/proc/self/fd` link, so a symlink planted by an earlier session cannot redirect a bind.

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::stat::Mode;
use nix::sys::statvfs::{FsFlags, statvfs};

use super::protect::{Protection, State};

/// The sandbox's `/etc/resolv.conf`: the in-namespace resolver only (resolv.conf(5)).
pub const RESOLV_CONF: &str = "nameserver 127.0.0.53\n";
/// Size of the private `/tmp`.
pub const TMP_SIZE: &str = "512m";
/// Size of the private empty home for `exec`.
pub const HOME_SIZE: &str = "256m";

/// Host `/etc` entries bound read-only (never `shadow` or host keys).
pub const ETC_BINDS: &[&str] =
    &["ssl", "ca-certificates", "localtime", "nsswitch.conf", "ld.so.cache", "alternatives"];
/// Top-level system directories (symlinks on merged-/usr systems) shown read-only.
pub const SYSTEM_DIRS: &[&str] = &["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];
/// Device nodes bound from the host into the minimal `/dev`.
pub const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];
/// /proc entries made read-only (docker's list).
pub const PROC_READONLY: &[&str] = &["sys", "sysrq-trigger", "irq", "bus", "fs"];
/// /proc files hidden behind /dev/null.
pub const PROC_MASKED: &[&str] = &["kcore", "keys", "timer_list", "sched_debug", "latency_stats"];

/// One step of the plan. Paths named `path`/`dst` are inside the sandbox; `src` on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Dir {
        path: PathBuf,
        mode: u32,
    },
    File {
        path: PathBuf,
        contents: String,
        mode: u32,
    },
    Symlink {
        target: PathBuf,
        path: PathBuf,
    },
    Tmpfs {
        path: PathBuf,
        size: &'static str,
        mode: u32,
    },
    /// Bind a host path (file or directory) into the sandbox.
    BindHost {
        src: PathBuf,
        dst: PathBuf,
        ro: bool,
    },
    /// Bind `root/rel` without following any symlink below `root`, read-only or read-write.
    /// `root` is a host path, or (with `inside`) a path in the tree being built.
    BindBeneath {
        root: PathBuf,
        rel: PathBuf,
        dst: PathBuf,
        ro: bool,
        inside: bool,
    },
    Proc {
        path: PathBuf,
    },
    Devpts {
        path: PathBuf,
    },
    /// Cover `root/rel` (a file in the tree being built, reached without following symlinks)
    /// with a bind of a symlink to `target`, made as `scratch` in the setup root, which the
    /// sandbox never sees ([`super::gitconfig`]).
    BindSymlink {
        target: PathBuf,
        root: PathBuf,
        rel: PathBuf,
        scratch: String,
    },
    /// Make an existing sandbox path (already a mount) read-only.
    RemountRo {
        path: PathBuf,
    },
}

/// Facts about the host the plan depends on (gathered by [`HostView::read`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostView {
    /// Each system dir: `Some(Some(target))` symlink, `Some(None)` directory, `None` absent.
    pub system: Vec<(String, Option<Option<PathBuf>>)>,
    /// Each `/etc` bind: same encoding.
    pub etc: Vec<(String, Option<Option<PathBuf>>)>,
    /// /proc entries that exist (so masking does not fail on kernels without them).
    pub proc_entries: Vec<String>,
    /// The entries of `/etc/ssl` that are bound when it is a directory: everything but private
    /// key directories ([`is_private_key_entry`]); same encoding as `system`.
    pub ssl: Vec<(String, Option<Option<PathBuf>>)>,
}

/// A private-key entry of `/etc/ssl` that is never bound (SECURITY §7): `private/` (and any name
/// containing `private`), or anything others may not read.
pub fn is_private_key_entry(name: &str, mode: u32, is_dir: bool) -> bool {
    let others_can_read = if is_dir { mode & 0o005 == 0o005 } else { mode & 0o004 != 0 };
    name.contains("private") || !others_can_read
}

fn ssl_entries() -> Vec<(String, Option<Option<PathBuf>>)> {
    let mut out: Vec<(String, Option<Option<PathBuf>>)> = std::fs::read_dir("/etc/ssl")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_owned();
            let path = e.path();
            let meta = fs::symlink_metadata(&path).ok()?;
            if meta.file_type().is_symlink() {
                return Some((name, Some(fs::read_link(&path).ok())));
            }
            (!is_private_key_entry(&name, meta.permissions().mode(), meta.is_dir()))
                .then_some((name, Some(None)))
        })
        .collect();
    out.sort();
    out
}

fn kind_of(path: &Path) -> Option<Option<PathBuf>> {
    let meta = fs::symlink_metadata(path).ok()?;
    if meta.file_type().is_symlink() { Some(fs::read_link(path).ok()) } else { Some(None) }
}

impl HostView {
    pub fn read() -> Self {
        let system = SYSTEM_DIRS.iter().map(|d| (d.to_string(), kind_of(&Path::new("/").join(d))));
        let etc = ETC_BINDS.iter().map(|e| (e.to_string(), kind_of(&Path::new("/etc").join(e))));
        let proc_entries = PROC_READONLY
            .iter()
            .chain(PROC_MASKED)
            .filter(|e| Path::new("/proc").join(e).exists())
            .map(|e| e.to_string())
            .collect();
        Self { system: system.collect(), etc: etc.collect(), proc_entries, ssl: ssl_entries() }
    }
}

/// What `/home/agent` is.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum HomeMount {
    /// `exec`: a private, size-limited tmpfs that vanishes with the session.
    #[default]
    Tmpfs,
    /// `run`: the per-repo agent home `parent/name` (SECURITY §4), bound read-write as a
    /// directory (so the agent's atomic renames work) without following a symlink at `name`.
    Bind { parent: PathBuf, name: String },
}

/// Inputs of the plan besides the host view.
#[derive(Debug, Clone)]
pub struct PlanInput<'a> {
    pub repo_host: &'a Path,
    pub repo_sandbox: &'a Path,
    pub hostname: &'a str,
    pub uid: u32,
    pub gid: u32,
    pub protection: &'a Protection,
    pub home: &'a HomeMount,
    /// `(host src, sandbox dst)` trees bound read-only (an agent's package and interpreter).
    /// Sources are canonical host paths, opened without following symlinks.
    pub ro_binds: &'a [(PathBuf, PathBuf)],
    /// `(link, target)` symlinks made inside (`/opt/airlock/bin/claude` → the agent).
    pub symlinks: &'a [(PathBuf, PathBuf)],
    /// Mounts a person chose and the per-repo caches, already judged
    /// ([`super::usermount::MountRules`]): canonical sources, parents first.
    pub user_mounts: &'a [super::usermount::UserMount],
    /// Git configs shown through a symlink into a private writable copy instead of read-only.
    pub git_configs: &'a [super::gitconfig::Redirect],
    /// Files of Airlock's own in the synthesized `/etc` (read-only with the rest of the root).
    pub etc_files: &'a [EtcFile],
}

/// A file Airlock writes under `/etc` inside, e.g. `/etc/claude-code/managed-settings.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcFile {
    /// Absolute, under `/etc/`, no `..`; its parent directories are made (0755).
    pub path: PathBuf,
    pub contents: String,
    pub mode: u32,
}

fn root(p: &str) -> PathBuf {
    PathBuf::from(p)
}

/// `/etc/passwd`: root, the caller's uid as `agent` (home `/home/agent`), and nobody (where
/// unmapped ids show up).
pub fn passwd(uid: u32, gid: u32) -> String {
    let mut s = String::new();
    if uid == 0 {
        s.push_str("root:x:0:0:Airlock agent:/home/agent:/bin/sh\n");
    } else {
        s.push_str("root:x:0:0:root:/root:/usr/sbin/nologin\n");
        s.push_str(&format!("agent:x:{uid}:{gid}:Airlock agent:/home/agent:/bin/sh\n"));
    }
    s.push_str("nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n");
    s
}

/// `/etc/group` matching [`passwd`].
pub fn group(gid: u32) -> String {
    let mut s = String::from("root:x:0:\n");
    if gid != 0 {
        s.push_str(&format!("agent:x:{gid}:\n"));
    }
    s.push_str("nogroup:x:65534:\n");
    s
}

/// Builds the complete plan, in execution order.
pub fn plan(input: &PlanInput<'_>, host: &HostView) -> Vec<Op> {
    let mut ops = Vec::new();
    let dir = |path: &str, mode| Op::Dir { path: root(path), mode };
    for d in ["/etc", "/proc", "/dev", "/tmp", "/home", "/home/agent", "/run"] {
        ops.push(dir(d, 0o755));
    }
    for (name, kind) in &host.system {
        let path = Path::new("/").join(name);
        match kind {
            Some(Some(target)) => ops.push(Op::Symlink { target: target.clone(), path }),
            Some(None) => {
                ops.push(Op::Dir { path: path.clone(), mode: 0o755 });
                ops.push(Op::BindHost { src: path.clone(), dst: path, ro: true });
            }
            None => {}
        }
    }
    // Synthesized /etc.
    let file = |path: &str, contents: String| Op::File { path: root(path), contents, mode: 0o644 };
    ops.push(file("/etc/passwd", passwd(input.uid, input.gid)));
    ops.push(file("/etc/group", group(input.gid)));
    ops.push(file(
        "/etc/hosts",
        format!(
            "127.0.0.1\tlocalhost {}\n::1\tlocalhost ip6-localhost ip6-loopback\n",
            input.hostname
        ),
    ));
    ops.push(file("/etc/hostname", format!("{}\n", input.hostname)));
    // The resolver airlockd answers on the sockets made inside (proxy::dns). A file of the new
    // root (a tmpfs, read-only at the end): nothing of the host's is written or read back.
    ops.push(file("/etc/resolv.conf", RESOLV_CONF.to_owned()));
    for f in input.etc_files {
        // Only under /etc, never through `..`: the plan is built from the CLI's own constants,
        // and this keeps it so.
        let plain = f
            .path
            .components()
            .all(|c| matches!(c, std::path::Component::RootDir | std::path::Component::Normal(_)));
        if !plain || !f.path.starts_with("/etc/") {
            continue;
        }
        if let Some(parent) = f.path.parent().filter(|p| *p != Path::new("/etc")) {
            ops.push(Op::Dir { path: parent.to_owned(), mode: 0o755 });
        }
        ops.push(Op::File { path: f.path.clone(), contents: f.contents.clone(), mode: f.mode });
    }
    for (name, kind) in &host.etc {
        let path = Path::new("/etc").join(name);
        match kind {
            Some(Some(target)) => ops.push(Op::Symlink { target: target.clone(), path }),
            // `/etc/ssl` entry by entry, so `private/` (host keys) is never bound.
            Some(None) if name == "ssl" => {
                ops.push(Op::Dir { path: path.clone(), mode: 0o755 });
                for (entry, kind) in &host.ssl {
                    let p = path.join(entry);
                    match kind {
                        Some(Some(target)) => {
                            ops.push(Op::Symlink { target: target.clone(), path: p })
                        }
                        Some(None) => ops.push(Op::BindHost { src: p.clone(), dst: p, ro: true }),
                        None => {}
                    }
                }
            }
            Some(None) => ops.push(Op::BindHost { src: path.clone(), dst: path, ro: true }),
            None => {}
        }
    }
    // Private /tmp and home.
    ops.push(Op::Tmpfs { path: root("/tmp"), size: TMP_SIZE, mode: 0o1777 });
    match input.home {
        HomeMount::Tmpfs => {
            ops.push(Op::Tmpfs { path: root("/home/agent"), size: HOME_SIZE, mode: 0o700 })
        }
        HomeMount::Bind { parent, name } => ops.push(Op::BindBeneath {
            root: parent.clone(),
            rel: PathBuf::from(name),
            dst: root("/home/agent"),
            ro: false,
            inside: false,
        }),
    }
    // Minimal /dev with a private devpts.
    ops.push(Op::Tmpfs { path: root("/dev"), size: "64k", mode: 0o755 });
    for dev in DEVICES {
        let path = Path::new("/dev").join(dev);
        ops.push(Op::BindHost { src: path.clone(), dst: path, ro: false });
    }
    for (name, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
    ] {
        ops.push(Op::Symlink { target: root(target), path: Path::new("/dev").join(name) });
    }
    ops.push(dir("/dev/pts", 0o755));
    ops.push(Op::Devpts { path: root("/dev/pts") });
    ops.push(dir("/dev/shm", 0o1777));
    ops.push(Op::Tmpfs { path: root("/dev/shm"), size: "64m", mode: 0o1777 });
    ops.push(Op::RemountRo { path: root("/dev") });
    // Fresh /proc with the dangerous knobs read-only or masked.
    ops.push(Op::Proc { path: root("/proc") });
    for entry in PROC_READONLY.iter().filter(|e| host.proc_entries.iter().any(|p| p == *e)) {
        let path = Path::new("/proc").join(entry);
        ops.push(Op::BindBeneath {
            root: root("/proc"),
            rel: PathBuf::from(entry),
            dst: path.clone(),
            ro: true,
            inside: true,
        });
    }
    for entry in PROC_MASKED.iter().filter(|e| host.proc_entries.iter().any(|p| p == *e)) {
        let dst = Path::new("/proc").join(entry);
        ops.push(Op::BindHost { src: root("/dev/null"), dst, ro: true });
    }
    // The repo, read-write, then the protected paths.
    if let Some(parent) = input.repo_sandbox.parent()
        && parent != Path::new("/")
    {
        ops.push(Op::Dir { path: parent.to_path_buf(), mode: 0o755 });
    }
    ops.push(Op::Dir { path: input.repo_sandbox.to_path_buf(), mode: 0o755 });
    ops.push(Op::BindBeneath {
        root: input.repo_host.to_path_buf(),
        rel: PathBuf::new(),
        dst: input.repo_sandbox.to_path_buf(),
        ro: false,
        inside: false,
    });
    let prot = input.protection;
    // External git dirs (worktree/submodule `gitdir:` targets) at their host path.
    for ext in &prot.external {
        if ext.starts_with(input.repo_host) {
            continue;
        }
        ops.push(Op::Dir { path: ext.clone(), mode: 0o755 });
        ops.push(Op::BindBeneath {
            root: ext.clone(),
            rel: PathBuf::new(),
            dst: ext.clone(),
            ro: false,
            inside: false,
        });
    }
    let to_sandbox = |host: &Path| -> PathBuf {
        match host.strip_prefix(input.repo_host) {
            Ok(rel) => input.repo_sandbox.join(rel),
            Err(_) => host.to_path_buf(),
        }
    };
    for pinned in &prot.pinned {
        let dst = to_sandbox(pinned);
        ops.push(Op::BindBeneath {
            root: dst.clone(),
            rel: PathBuf::new(),
            dst,
            ro: false,
            inside: true,
        });
    }
    for r in input.git_configs {
        ops.push(Op::Dir { path: r.inside_dir.clone(), mode: 0o755 });
        ops.push(Op::BindBeneath {
            root: r.private_dir.clone(),
            rel: PathBuf::new(),
            dst: r.inside_dir.clone(),
            ro: false,
            inside: false,
        });
    }
    for item in &prot.listed {
        if let Some(i) = input.git_configs.iter().position(|r| r.host_file() == item.host_path())
            && matches!(item.state, State::File)
        {
            ops.push(Op::BindSymlink {
                target: input.git_configs[i].link_target(),
                root: to_sandbox(&item.root),
                rel: item.rel.clone(),
                scratch: format!("gitconfig-{i}"),
            });
            continue;
        }
        if matches!(item.state, State::Dir | State::File) {
            let dst = to_sandbox(&item.host_path());
            let root = to_sandbox(&item.root);
            ops.push(Op::BindBeneath { root, rel: item.rel.clone(), dst, ro: true, inside: true });
        }
    }
    // Agent trees: canonical host paths, so opening them beneath `/` with no symlinks allowed
    // fails rather than following a link swapped in since resolution.
    for (src, dst) in input.ro_binds {
        let rel = src.strip_prefix("/").unwrap_or(src).to_path_buf();
        ops.push(Op::BindBeneath {
            root: root("/"),
            rel,
            dst: dst.clone(),
            ro: true,
            inside: false,
        });
    }
    // Chosen mounts, opened the same way (a symlink swapped in since judging fails the bind).
    for m in input.user_mounts {
        let rel = m.src.strip_prefix("/").unwrap_or(&m.src).to_path_buf();
        ops.push(Op::BindBeneath {
            root: root("/"),
            rel,
            dst: m.dst.clone(),
            ro: !m.rw,
            inside: false,
        });
    }
    for (link, target) in input.symlinks {
        if let Some(parent) = link.parent() {
            ops.push(Op::Dir { path: parent.to_path_buf(), mode: 0o755 });
        }
        ops.push(Op::Symlink { target: target.clone(), path: link.clone() });
    }
    ops.push(Op::RemountRo { path: root("/") });
    ops
}

/// Where the new root is assembled during setup.
const NEWROOT: &str = "/newroot";
const OLDROOT: &str = "/oldroot";

fn at(base: &str, path: &Path) -> PathBuf {
    Path::new(base).join(path.strip_prefix("/").unwrap_or(path))
}

fn err(what: impl std::fmt::Display, path: &Path, e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("{what} {}: {e}", path.display()))
}

fn do_mount(
    src: Option<&Path>,
    dst: &Path,
    fstype: Option<&str>,
    flags: MsFlags,
    data: Option<&str>,
) -> io::Result<()> {
    mount(src, dst, fstype, flags, data).map_err(|e| err("mount", dst, e))
}

/// Remounts a bind read-only, keeping the flags the kernel locks for mounts inherited from a
/// more privileged namespace (nosuid/nodev/noexec/atime), which a remount must repeat.
fn remount_ro(path: &Path) -> io::Result<()> {
    let st = statvfs(path).map_err(|e| err("statvfs", path, e))?;
    let f = st.flags();
    let mut flags =
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID;
    for (have, want) in [
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ] {
        if f.contains(have) {
            flags |= want;
        }
    }
    do_mount(None, path, None, flags, None)
}

/// Opens `root/rel` as an O_PATH fd without following any symlink on the way (openat2(2)).
fn open_beneath(root: &Path, rel: &Path) -> io::Result<OwnedFd> {
    let dir = nix::fcntl::open(
        root,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| err("open", root, e))?;
    if rel.as_os_str().is_empty() {
        return Ok(dir);
    }
    let how = OpenHow::new().flags(OFlag::O_PATH | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW).resolve(
        ResolveFlag::RESOLVE_BENEATH
            | ResolveFlag::RESOLVE_NO_SYMLINKS
            | ResolveFlag::RESOLVE_NO_MAGICLINKS,
    );
    nix::fcntl::openat2(&dir, rel, how).map_err(|e| err("open (no symlinks)", &root.join(rel), e))
}

fn fd_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("{OLDROOT}/proc/self/fd/{}", fd.as_raw_fd()))
}

fn make_mountpoint(dst: &Path, is_dir: bool) -> io::Result<()> {
    if fs::symlink_metadata(dst).is_ok() {
        return Ok(());
    }
    if is_dir {
        fs::DirBuilder::new().recursive(true).mode(0o755).create(dst)
    } else {
        if let Some(parent) = dst.parent() {
            fs::DirBuilder::new().recursive(true).mode(0o755).create(parent)?;
        }
        fs::write(dst, b"")
    }
    .map_err(|e| err("create mount point", dst, e))
}

fn bind(src: &Path, dst: &Path, ro: bool) -> io::Result<()> {
    let is_dir = fs::metadata(src).map_err(|e| err("stat", src, e))?.is_dir();
    make_mountpoint(dst, is_dir)?;
    do_mount(Some(src), dst, None, MsFlags::MS_BIND | MsFlags::MS_REC, None)?;
    if ro { remount_ro(dst) } else { Ok(()) }
}

fn tmpfs(path: &Path, size: &str, mode: u32) -> io::Result<()> {
    make_mountpoint(path, true)?;
    let data = format!("size={size},mode={mode:o}");
    do_mount(
        Some(Path::new("tmpfs")),
        path,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(&data),
    )
}

/// Carries out `ops`. Must run in a fresh mount namespace with CAP_SYS_ADMIN over it; on
/// success the process's root is the new tree and its cwd `/`.
pub fn execute(ops: &[Op]) -> io::Result<()> {
    let none: Option<&Path> = None;
    // Nothing we do may propagate back to the host.
    do_mount(none, Path::new("/"), None, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None)?;
    tmpfs(Path::new("/tmp"), "1m", 0o755)?;
    std::env::set_current_dir("/tmp").map_err(|e| err("chdir", Path::new("/tmp"), e))?;
    for d in ["newroot", "oldroot"] {
        fs::create_dir(d).map_err(|e| err("mkdir", Path::new(d), e))?;
    }
    nix::unistd::pivot_root(".", "oldroot").map_err(|e| err("pivot_root", Path::new("/tmp"), e))?;
    std::env::set_current_dir("/").map_err(|e| err("chdir", Path::new("/"), e))?;
    tmpfs(Path::new(NEWROOT), "16m", 0o755)?;
    for op in ops {
        apply(op)?;
    }
    std::env::set_current_dir(NEWROOT).map_err(|e| err("chdir", Path::new(NEWROOT), e))?;
    nix::unistd::pivot_root(".", ".").map_err(|e| err("pivot_root", Path::new(NEWROOT), e))?;
    // One lazy detach takes the setup root and everything still mounted under it, the host tree
    // at /oldroot included (MNT_DETACH unmounts the whole subtree, umount(2)): each umount2
    // call waits out an RCU grace period (2–8 ms measured here), so one call instead of two.
    umount2(".", MntFlags::MNT_DETACH).map_err(|e| err("umount", Path::new("/"), e))?;
    std::env::set_current_dir("/").map_err(|e| err("chdir", Path::new("/"), e))
}

fn apply(op: &Op) -> io::Result<()> {
    match op {
        Op::Dir { path, mode } => {
            let p = at(NEWROOT, path);
            fs::DirBuilder::new()
                .recursive(true)
                .mode(*mode)
                .create(&p)
                .map_err(|e| err("mkdir", &p, e))?;
            fs::set_permissions(&p, fs::Permissions::from_mode(*mode))
                .map_err(|e| err("chmod", &p, e))
        }
        Op::File { path, contents, mode } => {
            let p = at(NEWROOT, path);
            fs::write(&p, contents).map_err(|e| err("write", &p, e))?;
            fs::set_permissions(&p, fs::Permissions::from_mode(*mode))
                .map_err(|e| err("chmod", &p, e))
        }
        Op::Symlink { target, path } => {
            let p = at(NEWROOT, path);
            std::os::unix::fs::symlink(target, &p).map_err(|e| err("symlink", &p, e))
        }
        Op::Tmpfs { path, size, mode } => tmpfs(&at(NEWROOT, path), size, *mode),
        Op::BindHost { src, dst, ro } => bind(&at(OLDROOT, src), &at(NEWROOT, dst), *ro),
        Op::BindBeneath { root, rel, dst, ro, inside } => {
            let root = at(if *inside { NEWROOT } else { OLDROOT }, root);
            let fd = open_beneath(&root, rel)?;
            let dst = at(NEWROOT, dst);
            let is_dir = fs::metadata(fd_path(&fd)).map_err(|e| err("stat", &dst, e))?.is_dir();
            make_mountpoint(&dst, is_dir)?;
            let dst_fd = open_beneath(&dst, Path::new("")).or_else(|_| open_file_path(&dst))?;
            do_mount(
                Some(&fd_path(&fd)),
                &fd_path(&dst_fd),
                None,
                MsFlags::MS_BIND | MsFlags::MS_REC,
                None,
            )?;
            if *ro { remount_ro(&dst) } else { Ok(()) }
        }
        Op::Proc { path } => {
            let p = at(NEWROOT, path);
            do_mount(
                Some(Path::new("proc")),
                &p,
                Some("proc"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                None,
            )
        }
        Op::Devpts { path } => {
            let p = at(NEWROOT, path);
            do_mount(
                Some(Path::new("devpts")),
                &p,
                Some("devpts"),
                MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
                Some("newinstance,ptmxmode=0666,mode=0620"),
            )
        }
        Op::BindSymlink { target, root, rel, scratch } => {
            // The setup root ("/" until the final pivot) holds the link; a bind of it outlives
            // that root (mount(2) pins the dentry), and only the bind is visible inside.
            let link = Path::new("/").join(scratch);
            std::os::unix::fs::symlink(target, &link).map_err(|e| err("symlink", &link, e))?;
            let src = open_file_path(&link)?;
            let dst_fd = open_beneath(&at(NEWROOT, root), rel)?;
            do_mount(Some(&fd_path(&src)), &fd_path(&dst_fd), None, MsFlags::MS_BIND, None)
        }
        Op::RemountRo { path } => remount_ro(&at(NEWROOT, path)),
    }
}

fn open_file_path(path: &Path) -> io::Result<OwnedFd> {
    nix::fcntl::open(path, OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|e| err("open", path, e))
}

/// Host paths the plan binds into the sandbox (for checks made before it exists).
pub fn host_sources(ops: &[Op]) -> Vec<PathBuf> {
    ops.iter()
        .filter_map(|op| match op {
            Op::BindHost { src, .. } => Some(src.clone()),
            Op::BindBeneath { root, rel, inside: false, .. } => Some(root.join(rel)),
            _ => None,
        })
        .collect()
}

/// Names the sandbox paths that must stay writable (Landlock rules).
pub fn writable_paths(repo_sandbox: &Path, external: &[PathBuf]) -> Vec<PathBuf> {
    let mut v = vec![repo_sandbox.to_path_buf(), root("/tmp"), root("/home/agent"), root("/dev")];
    v.extend(external.iter().cloned());
    v
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::sandbox::protect::Listed;

    fn host() -> HostView {
        HostView {
            system: vec![
                ("usr".into(), Some(None)),
                ("bin".into(), Some(Some("usr/bin".into()))),
                ("lib32".into(), None),
            ],
            etc: vec![
                ("ssl".into(), Some(None)),
                ("localtime".into(), Some(Some("/usr/share/zoneinfo/UTC".into()))),
                ("alternatives".into(), None),
            ],
            proc_entries: vec!["sys".into(), "sysrq-trigger".into(), "kcore".into()],
            ssl: vec![("certs".into(), Some(None)), ("openssl.cnf".into(), Some(None))],
        }
    }

    fn listed(repo: &Path, rel: &str, state: State) -> Listed {
        Listed {
            root: repo.into(),
            rel: rel.into(),
            state,
            id: None,
            placeholder: false,
            empty_at_start: false,
            needs_identity: false,
        }
    }

    fn protection(repo: &Path) -> Protection {
        Protection {
            listed: vec![
                listed(repo, ".git/hooks", State::Dir),
                listed(repo, ".envrc", State::Absent),
                listed(repo, ".mcp.json", State::Symlink("x".into())),
            ],
            pinned: vec![repo.join(".git")],
            external: vec![PathBuf::from("/elsewhere/main/.git")],
            ..Protection::default()
        }
    }

    /// The plan for an `exec` session (tmpfs home, no agent binds) of the repo at `repo`, shown
    /// as `/<name>`.
    fn plan_for(
        repo: &Path,
        name: &str,
        prot: &Protection,
        user_mounts: &[crate::sandbox::usermount::UserMount],
        git_configs: &[crate::sandbox::gitconfig::Redirect],
    ) -> Vec<Op> {
        let repo_sandbox = Path::new("/").join(name);
        let input = PlanInput {
            repo_host: repo,
            repo_sandbox: &repo_sandbox,
            hostname: name,
            uid: 1000,
            gid: 1000,
            protection: prot,
            home: &HomeMount::Tmpfs,
            ro_binds: &[],
            symlinks: &[],
            user_mounts,
            git_configs,
            etc_files: &[],
        };
        plan(&input, &host())
    }

    fn ops() -> Vec<Op> {
        let repo = Path::new("/home/u/src/pay");
        plan_for(repo, "pay", &protection(repo), &[], &[])
    }

    #[test]
    fn system_dirs_are_read_only_and_symlinks_copied() {
        let ops = ops();
        assert!(ops.contains(&Op::BindHost { src: "/usr".into(), dst: "/usr".into(), ro: true }));
        assert!(ops.contains(&Op::Symlink { target: "usr/bin".into(), path: "/bin".into() }));
        assert!(!ops.iter().any(|o| format!("{o:?}").contains("lib32")));
    }

    #[test]
    fn etc_is_synthesized_and_never_binds_secrets() {
        let ops = ops();
        let dump = format!("{ops:?}");
        assert!(!dump.contains("shadow") && !dump.contains("ssh"));
        assert!(ops.contains(&Op::BindHost {
            src: "/etc/ssl/certs".into(),
            dst: "/etc/ssl/certs".into(),
            ro: true
        }));
        assert!(
            !ops.iter()
                .any(|o| matches!(o, Op::BindHost { src, .. } if src == Path::new("/etc/ssl")))
        );
        assert!(!dump.contains("private"));
        assert!(ops.contains(&Op::File {
            path: "/etc/resolv.conf".into(),
            contents: "nameserver 127.0.0.53\n".into(),
            mode: 0o644
        }));
        assert!(ops.iter().any(|o| matches!(o, Op::File { path, contents, .. }
            if path == Path::new("/etc/passwd") && contents.contains("agent:x:1000:1000"))));
        assert!(ops.iter().any(|o| matches!(o, Op::File { path, contents, .. }
            if path == Path::new("/etc/hosts") && contents.contains("127.0.0.1\tlocalhost pay"))));
    }

    #[test]
    fn repo_then_pins_then_read_only_listed_paths() {
        let ops = ops();
        let pos = |needle: &Op| ops.iter().position(|o| o == needle).unwrap();
        let repo = pos(&Op::BindBeneath {
            root: "/home/u/src/pay".into(),
            rel: "".into(),
            dst: "/pay".into(),
            ro: false,
            inside: false,
        });
        let pin = pos(&Op::BindBeneath {
            root: "/pay/.git".into(),
            rel: "".into(),
            dst: "/pay/.git".into(),
            ro: false,
            inside: true,
        });
        let hooks = pos(&Op::BindBeneath {
            root: "/pay".into(),
            rel: ".git/hooks".into(),
            dst: "/pay/.git/hooks".into(),
            ro: true,
            inside: true,
        });
        assert!(repo < pin && pin < hooks);
        // Absent and symlinked listed paths are not bound (they are checked at the end).
        let dump = format!("{ops:?}");
        assert!(!dump.contains(".envrc") && !dump.contains(".mcp.json"));
        assert!(ops.contains(&Op::BindBeneath {
            root: "/elsewhere/main/.git".into(),
            rel: "".into(),
            dst: "/elsewhere/main/.git".into(),
            ro: false,
            inside: false,
        }));
        assert_eq!(ops.last(), Some(&Op::RemountRo { path: "/".into() }));
    }

    #[test]
    fn chosen_mounts_are_bound_beneath_root_after_the_walls_and_before_the_final_remount() {
        use crate::sandbox::usermount::UserMount;
        let repo = Path::new("/home/u/src/pay");
        let prot = protection(repo);
        let mounts = [
            UserMount { src: "/opt/tools".into(), dst: "/opt/tools".into(), rw: false },
            UserMount {
                src: "/h/.airlock/cache/k/cargo".into(),
                dst: "/opt/airlock/cache/cargo".into(),
                rw: true,
            },
        ];
        let ops = plan_for(repo, "pay", &prot, &mounts, &[]);
        let tools = ops
            .iter()
            .position(|o| {
                o == &Op::BindBeneath {
                    root: "/".into(),
                    rel: "opt/tools".into(),
                    dst: "/opt/tools".into(),
                    ro: true,
                    inside: false,
                }
            })
            .unwrap();
        let cache = ops
            .iter()
            .position(|o| {
                o == &Op::BindBeneath {
                    root: "/".into(),
                    rel: "h/.airlock/cache/k/cargo".into(),
                    dst: "/opt/airlock/cache/cargo".into(),
                    ro: false,
                    inside: false,
                }
            })
            .unwrap();
        let hooks = ops
            .iter()
            .position(
                |o| matches!(o, Op::BindBeneath { rel, .. } if rel == Path::new(".git/hooks")),
            )
            .unwrap();
        assert!(hooks < tools && tools < cache && cache < ops.len() - 1);
        assert_eq!(ops.last(), Some(&Op::RemountRo { path: "/".into() }));
    }

    #[test]
    fn a_redirected_git_config_is_a_bound_symlink_into_its_writable_private_copy() {
        let repo = Path::new("/home/u/proj");
        let mut prot = protection(repo);
        prot.listed.push(listed(repo, ".git/config", State::File));
        let redirect = crate::sandbox::gitconfig::Redirect {
            root: repo.to_path_buf(),
            rel: PathBuf::from(".git/config"),
            private_dir: PathBuf::from("/home/u/.airlock/quarantine/s/.gitconfig-work/0"),
            inside_dir: PathBuf::from("/opt/airlock/git/0"),
        };
        let ops = plan_for(repo, "proj", &prot, &[], std::slice::from_ref(&redirect));
        assert!(ops.contains(&Op::BindBeneath {
            root: redirect.private_dir.clone(),
            rel: PathBuf::new(),
            dst: redirect.inside_dir.clone(),
            ro: false,
            inside: false,
        }));
        assert!(ops.contains(&Op::BindSymlink {
            target: PathBuf::from("/opt/airlock/git/0/config"),
            root: PathBuf::from("/proj"),
            rel: PathBuf::from(".git/config"),
            scratch: "gitconfig-0".into(),
        }));
        // Never also a read-only bind of the file, which git could not rename over.
        assert!(!ops.iter().any(|op| matches!(op, Op::BindBeneath { rel, .. }
            if rel == Path::new(".git/config"))));
        // The other protected paths are unchanged.
        assert!(ops.iter().any(|op| matches!(op, Op::BindBeneath { rel, ro: true, .. }
            if rel == Path::new(".git/hooks"))));
    }

    #[test]
    fn proc_knobs_are_covered_and_tmp_is_size_limited() {
        let ops = ops();
        assert!(ops.iter().any(|o| matches!(o, Op::BindBeneath { rel, ro: true, .. }
            if rel == Path::new("sysrq-trigger"))));
        assert!(ops.contains(&Op::BindHost {
            src: "/dev/null".into(),
            dst: "/proc/kcore".into(),
            ro: true
        }));
        assert!(ops.contains(&Op::Tmpfs { path: "/tmp".into(), size: TMP_SIZE, mode: 0o1777 }));
        assert!(ops.contains(&Op::Devpts { path: "/dev/pts".into() }));
    }
}
