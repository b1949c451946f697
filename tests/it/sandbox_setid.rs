//! No setuid/setgid bit can be made inside the sandbox (SECURITY §7): every call that takes a
//! mode is tried by raw number (x86_64, arch/x86/entry/syscalls/syscall_64.tbl) with a setid
//! mode on files in the repo, then checked from the host. Uses the test-only `hold` bridge: no
//! daemon is needed.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::support::{World, have};

/// Every (name, expected) line the script below prints.
const EXPECTED: &[(&str, &str)] = &[
    ("chmod", "EPERM"),
    ("fchmod", "EPERM"),
    ("fchmodat", "EPERM"),
    ("fchmodat2", "EPERM"),
    ("open", "EPERM"),
    ("openat", "EPERM"),
    ("creat", "EPERM"),
    ("mkdir", "EPERM"),
    ("mkdirat", "EPERM"),
    ("mknod", "EPERM"),
    ("mknodat", "EPERM"),
    ("openat2", "ENOSYS"),
    ("chmod_ok", "OK"),
    ("fchmod_ok", "OK"),
    ("fchmodat_ok", "OK"),
    ("fchmodat2_ok", "OK"),
    ("open_ok", "OK"),
    ("openat_ok", "OK"),
    ("creat_ok", "OK"),
    ("mkdir_ok", "OK"),
    ("mkdirat_ok", "OK"),
    ("mknod_ok", "OK"),
    ("mknodat_ok", "OK"),
];

const SCRIPT: &str = r#"
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
L = ctypes.c_long
AT_FDCWD = -100
O_WRONLY_CREAT = 0o1 | 0o100
S_IFREG, S_IFIFO = 0o100000, 0o010000
def sc(name, nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(L(nr), *[L(a) if isinstance(a, int) else a for a in args])
    e = ctypes.get_errno()
    print(name, 'OK' if r >= 0 else errno.errorcode.get(e, e), flush=True)
    if r >= 0 and name.startswith(('open', 'creat')):
        os.close(r)
open('f', 'w').close()
fd = os.open('f', os.O_RDONLY)
# Setuid/setgid modes: refused by the filter.
sc('chmod', 90, b'f', 0o4755)
sc('fchmod', 91, fd, 0o2755)
sc('fchmodat', 268, AT_FDCWD, b'f', 0o4755)
sc('fchmodat2', 452, AT_FDCWD, b'f', 0o6755, 0)
sc('open', 2, b'n_open', O_WRONLY_CREAT, 0o4755)
sc('openat', 257, AT_FDCWD, b'n_openat', O_WRONLY_CREAT, 0o2755)
sc('creat', 85, b'n_creat', 0o4755)
sc('mkdir', 83, b'n_mkdir', 0o2755)
sc('mkdirat', 258, AT_FDCWD, b'n_mkdirat', 0o4755)
sc('mknod', 133, b'n_mknod', S_IFIFO | 0o4644, 0)
sc('mknodat', 259, AT_FDCWD, b'n_mknodat', S_IFREG | 0o2644, 0)
how = ctypes.create_string_buffer(24)  # struct open_how, zeroed: a plain O_RDONLY open
sc('openat2', 437, AT_FDCWD, b'f', how, 24)
# Ordinary modes: allowed (and prove the numbers above reach the kernel).
sc('chmod_ok', 90, b'f', 0o755)
sc('fchmod_ok', 91, fd, 0o644)
sc('fchmodat_ok', 268, AT_FDCWD, b'f', 0o755)
sc('fchmodat2_ok', 452, AT_FDCWD, b'f', 0o644, 0)
sc('open_ok', 2, b'ok_open', O_WRONLY_CREAT, 0o644)
sc('openat_ok', 257, AT_FDCWD, b'ok_openat', O_WRONLY_CREAT, 0o644)
sc('creat_ok', 85, b'ok_creat', 0o644)
sc('mkdir_ok', 83, b'ok_mkdir', 0o755)
sc('mkdirat_ok', 258, AT_FDCWD, b'ok_mkdirat', 0o1777)
sc('mknod_ok', 133, b'ok_mknod', S_IFIFO | 0o644, 0)
sc('mknodat_ok', 259, AT_FDCWD, b'ok_mknodat', S_IFREG | 0o644, 0)
print('done')
"#;

/// Every path under `dir` whose mode carries S_ISUID or S_ISGID.
fn setid_paths(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let meta = entry.path().symlink_metadata().unwrap();
        if meta.permissions().mode() & 0o6000 != 0 {
            out.push(format!("{} {:o}", entry.path().display(), meta.permissions().mode()));
        }
        if meta.is_dir() {
            out.extend(setid_paths(&entry.path()));
        }
    }
    out
}

#[cfg(target_arch = "x86_64")]
#[test]
fn sandbox_cannot_set_setuid_or_setgid_bits() {
    if !have("python3") {
        return;
    }
    let world = World::new();
    let repo = world.repo("setid");
    world.write(world.home.join(".airlock/config.toml"), "[network]\nallow = [\"example.test\"]\n");
    let exec = |args: &[&str]| {
        world
            .airlock(&repo)
            .hook("AIRLOCK_TEST_PROXY_BRIDGE", "hold")
            .args(["exec", "--"])
            .args(args)
            .run()
            .expect_code(0)
            .stdout()
    };
    // Step 1, inside: each call by raw number.
    let out = exec(&["python3", "-c", SCRIPT]);
    let expected: String =
        EXPECTED.iter().map(|(name, want)| format!("{name} {want}\n")).collect::<String>()
            + "done\n";
    assert_eq!(out, expected);
    // And the way an agent would: chmod(1) fails, and the bit is not there (the file keeps the
    // 0644 `fchmodat2_ok` gave it).
    let out = exec(&[
        "sh",
        "-c",
        "chmod 4755 f; echo chmod=$?; chmod g+s f; echo chmod=$?; stat -c %a f",
    ]);
    assert_eq!(out, "chmod=1\nchmod=1\n644\n");

    // Step 2, on the host: nothing setid anywhere in the repo, the refused names do not exist,
    // the allowed ones do.
    assert_eq!(setid_paths(&repo), Vec::<String>::new());
    for call in ["open", "openat", "creat", "mkdir", "mkdirat", "mknod", "mknodat"] {
        let refused = repo.join(format!("n_{call}"));
        assert!(refused.symlink_metadata().is_err(), "{} was created", refused.display());
        let allowed = repo.join(format!("ok_{call}"));
        assert!(allowed.symlink_metadata().is_ok(), "{} is missing", allowed.display());
    }
    let f = std::fs::metadata(repo.join("f")).unwrap().permissions().mode();
    assert_eq!(f & 0o6000, 0, "{f:o}");
}
