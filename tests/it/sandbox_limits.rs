//! The sandbox's resource limits and Landlock rules, attempted for real (SECURITY §4 "Limits",
//! docs/sandbox.md "Limits"): writing past each tmpfs's size fails with ENOSPC, a fork bomb
//! stops at `RLIMIT_NPROC`, and with Landlock on a write outside the allowed set is refused.
//! Uses the test-only `hold` bridge: no daemon is needed. Runs as root and, through
//! `.ci/unprivileged` (filter `sandbox`), as an unprivileged user.

use crate::sandbox::prereqs;
use crate::support::{self, Sandbox};

/// Sizes from docs/sandbox.md "Limits" (MiB), written here rather than taken from
/// `sandbox::mounts`, so a changed or dropped size fails the test.
const TMPFS_MIB: &[(&str, u64)] = &[("/tmp", 512), ("/home/agent", 256), ("/dev/shm", 64)];

/// `RLIMIT_NPROC` of the command (docs/sandbox.md "Limits").
const NPROC: u64 = 4096;

#[test]
fn writing_past_each_tmpfs_size_fails_with_enospc() {
    if !prereqs(&["python3"]) {
        return;
    }
    let sb = Sandbox::new("tmpfs");
    // For each tmpfs: its size (statvfs), what was in use, then 1 MiB writes until the kernel
    // refuses (at most 2 GiB, so a missing limit cannot fill the host's memory); the file is
    // removed before the next, so at most one limit's worth of memory is held.
    let code = "import errno, os\n\
        chunk = b'\\0' * (1 << 20)\n\
        for d in ['/tmp', '/home/agent', '/dev/shm']:\n\
        \x20   st = os.statvfs(d)\n\
        \x20   size, used = st.f_blocks * st.f_frsize, (st.f_blocks - st.f_bfree) * st.f_frsize\n\
        \x20   path, written, result = d + '/fill', 0, 'NO LIMIT'\n\
        \x20   fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)\n\
        \x20   try:\n\
        \x20       while written < (2 << 30):\n\
        \x20           written += os.write(fd, chunk)\n\
        \x20   except OSError as e:\n\
        \x20       result = errno.errorcode[e.errno]\n\
        \x20   os.close(fd); os.unlink(path)\n\
        \x20   print(d, result, 'size', size >> 20, 'MiB', 'filled', used + written == size)\n";
    let out = sb.py(code).expect_code(0).stdout();
    let expected: String = TMPFS_MIB
        .iter()
        .map(|(dir, mib)| format!("{dir} ENOSPC size {mib} MiB filled True\n"))
        .collect();
    assert_eq!(out, expected);
}

#[test]
fn a_fork_bomb_stops_at_rlimit_nproc() {
    if !prereqs(&["python3"]) {
        return;
    }
    let sb = Sandbox::new("nproc");
    let limits = sb.sh("grep '^Max processes' /proc/self/limits").expect_code(0).stdout();
    let fields: Vec<&str> = limits.split_whitespace().collect();
    let limit = NPROC.to_string();
    assert_eq!(fields, ["Max", "processes", &limit, &limit, "processes"], "{limits}");
    if nix::unistd::geteuid().is_root() {
        // The kernel exempts the host's root user from RLIMIT_NPROC (fork.c, INIT_USER;
        // docs/security.md "Known limits"): the limit is set (above) but cannot be reached.
        eprintln!("NOTE: root caller, RLIMIT_NPROC is not enforced; the bomb runs unprivileged");
        return;
    }
    // Threads count against RLIMIT_NPROC like processes (clone(2)) and cost far less memory.
    // The limit counts this user's tasks in the sandbox's user namespace: init, python3 and
    // its threads; then a fork past it fails with EAGAIN.
    let code = "import errno, os, threading\n\
        threading.stack_size(64 << 10)\n\
        stop, n, err = threading.Event(), 0, 'none'\n\
        try:\n\
        \x20   while n < 3 * 4096:\n\
        \x20       threading.Thread(target=stop.wait).start(); n += 1\n\
        except RuntimeError as e:\n\
        \x20   err = 'RuntimeError'\n\
        try:\n\
        \x20   pid = os.fork()\n\
        \x20   if pid == 0:\n\
        \x20       os._exit(0)\n\
        \x20   os.waitpid(pid, 0); fork = 'OK'\n\
        except OSError as e:\n\
        \x20   fork = errno.errorcode[e.errno]\n\
        tasks = len(os.listdir('/proc/self/task'))\n\
        stop.set()\n\
        print('threads stopped by', err, 'tasks', tasks, 'fork', fork)\n";
    let run = sb.py(code).expect_code(0);
    // Tasks of the user inside: init (1) + python3's tasks.
    let tasks = NPROC - 1;
    assert_eq!(
        run.stdout(),
        format!("threads stopped by RuntimeError tasks {tasks} fork EAGAIN\n"),
        "{}",
        run.stderr()
    );
}

#[test]
fn landlock_refuses_writes_outside_the_allowed_set() {
    if !prereqs(&["python3"]) {
        return;
    }
    let sb = Sandbox::new("landlock");
    // The probe `exec` decides with: Landlock ABI >= 6 is "ok"; anything else means the rules
    // are not (fully) enforced here, which CI must not accept silently.
    let doctor = sb.world.airlock(&sb.repo).args(["doctor", "--json"]).run();
    let checks: serde_json::Value = serde_json::from_str(&doctor.stdout()).unwrap();
    let landlock = checks
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["detail"].as_str().is_some_and(|d| d.starts_with("landlock: ")))
        .unwrap_or_else(|| panic!("no landlock line in doctor: {checks}"))
        .clone();
    if landlock["level"] != "ok" {
        assert!(!support::in_ci(), "Landlock ABI >= 6 is a CI prerequisite: {landlock}");
        eprintln!("SKIP: {landlock}");
        return;
    }
    // /proc is mounted read-write inside and a process may write its own `comm` and raise its
    // own `oom_score_adj` (proc(5)) — only Landlock (write only in the repo, the home, /tmp,
    // /dev) refuses them. The repo write is the allowed side.
    let code = "import errno\n\
        for p in ['/proc/self/comm', '/proc/self/oom_score_adj']:\n\
        \x20   try:\n\
        \x20       with open(p, 'w') as f:\n\
        \x20           f.write('500\\n')\n\
        \x20       print(p, 'WRITTEN')\n\
        \x20   except OSError as e:\n\
        \x20       print(p, errno.errorcode[e.errno])\n\
        print('comm', open('/proc/self/comm').read().strip())\n\
        for d in ['.', '/home/agent', '/tmp', '/dev/shm']:\n\
        \x20   open(d + '/landlock-ok', 'w').write('ok')\n\
        \x20   print(d, 'ok')\n";
    let out = sb.py(code).expect_code(0).stdout();
    assert_eq!(
        out,
        "/proc/self/comm EACCES\n/proc/self/oom_score_adj EACCES\ncomm python3\n\
         . ok\n/home/agent ok\n/tmp ok\n/dev/shm ok\n"
    );
    assert_eq!(std::fs::read_to_string(sb.repo.join("landlock-ok")).unwrap(), "ok");
}
