//! The sandbox's walls, attempted for real (SECURITY §6, issue 5). Every escape attempt runs
//! inside `airlock exec` and must fail; sentinel listeners on the host's loopback record any
//! connection that leaks. Runs as root and, through `.ci/unprivileged`, as an unprivileged user.
//! Network-escape tests use the test-only `hold` bridge: the listener exists and nothing serves
//! it, so the only thing that could carry traffic out is a hole in the walls.
// Without `test-hooks` only the tests needing no hook are built; helpers the others share
// are then unused.
#![cfg_attr(not(feature = "test-hooks"), allow(dead_code, unused_imports))]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, UdpSocket};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::support::{self, PtyOutput, Sandbox, World, have};

pub(crate) fn prereqs(tools: &[&str]) -> bool {
    tools.iter().all(|t| have(t))
}

/// Host-side listeners on every address (so connections to loopback *or* the host's own
/// interface addresses are caught), counting whatever reaches them.
struct Sentinel {
    tcp_port: u16,
    udp_port: u16,
    hits: Arc<AtomicUsize>,
}

impl Sentinel {
    fn start() -> Self {
        let hits = Arc::new(AtomicUsize::new(0));
        let tcp = TcpListener::bind("0.0.0.0:0").unwrap();
        let tcp_port = tcp.local_addr().unwrap().port();
        let h = hits.clone();
        std::thread::spawn(move || {
            for conn in tcp.incoming() {
                if conn.is_ok() {
                    h.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        let udp = UdpSocket::bind("0.0.0.0:0").unwrap();
        let udp_port = udp.local_addr().unwrap().port();
        let h = hits.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            while udp.recv_from(&mut buf).is_ok() {
                h.fetch_add(1, Ordering::SeqCst);
            }
        });
        Self { tcp_port, udp_port, hits }
    }

    #[track_caller]
    fn assert_untouched(&self) {
        // Give a leaked connection time to be accepted before judging.
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(self.hits.load(Ordering::SeqCst), 0, "a connection reached a host sentinel");
    }
}

/// The host's own IPv4 addresses (loopback and interfaces).
fn host_addresses() -> Vec<String> {
    let mut out = vec!["127.0.0.1".to_string()];
    if let Ok(addrs) = nix::ifaddrs::getifaddrs() {
        for a in addrs {
            if let Some(sin) = a.address.as_ref().and_then(|s| s.as_sockaddr_in()) {
                let ip = sin.ip().to_string();
                if !out.contains(&ip) {
                    out.push(ip);
                }
            }
        }
    }
    out
}

#[cfg(feature = "test-hooks")]
#[test]
fn runs_as_the_caller_with_every_capability_cleared() {
    if !prereqs(&["python3"]) {
        return;
    }
    let sb = Sandbox::new("caps");
    let run = sb.sh("grep -E '^(Cap|NoNewPrivs|Seccomp)' /proc/self/status; id -u; hostname; pwd");
    let out = run.expect_code(0).stdout();
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert!(out.contains(&format!("{set}:\t0000000000000000")), "{set} not empty:\n{out}");
    }
    assert!(out.contains("NoNewPrivs:\t1") && out.contains("Seccomp:\t2"), "{out}");
    let uid = nix::unistd::getuid().as_raw();
    assert!(out.contains(&format!("\n{uid}\n")), "uid must map to itself:\n{out}");
    assert!(out.contains("\ncaps\n/caps\n"), "hostname and cwd are the repo name:\n{out}");
    // securebits locked: NOROOT|NOROOT_LOCKED|NO_SETUID_FIXUP(+LOCKED)|... (prctl PR_GET_SECUREBITS)
    let bits = sb.py("import ctypes; print(ctypes.CDLL(None).prctl(27, 0, 0, 0, 0))");
    let bits: u64 = bits.expect_code(0).stdout().trim().parse().unwrap();
    assert_eq!(bits & 0b1111, 0b1111, "securebits {bits:#b}");
}

#[cfg(feature = "test-hooks")]
#[test]
fn setuid_binaries_gain_nothing() {
    if !prereqs(&["su", "mount"]) {
        return;
    }
    let sb = Sandbox::new("suid");
    // `su` is setuid root on the host; inside (no_new_privs, no capabilities) it runs as the
    // caller and cannot authenticate, and mount(8) is refused. The first line proves the
    // script ran inside (hostname and uid), so a sandbox that never started cannot pass.
    let run = sb.sh(
        "echo \"inside $(hostname) uid=$(id -u)\"; out=$(su -c 'id -u' root </dev/null 2>/dev/null); \
         echo \"su=$? out=$out\"; mount -t tmpfs x /tmp 2>/dev/null; echo mount=$?; \
         grep CapEff /proc/self/status",
    );
    let uid = nix::unistd::getuid().as_raw();
    let out = run.expect_code(0).stdout();
    assert_eq!(
        out,
        format!("inside suid uid={uid}\nsu=1 out=\nmount=32\nCapEff:\t0000000000000000\n")
    );
}

#[cfg(feature = "test-hooks")]
#[test]
fn direct_connections_to_host_listeners_fail() {
    if !prereqs(&["python3", "curl", "bash"]) {
        return;
    }
    let sentinel = Sentinel::start();
    let sb = Sandbox::new("net");
    for addr in host_addresses() {
        let (t, u) = (sentinel.tcp_port, sentinel.udp_port);
        let run = sb
            .exec(&["curl", "-sS", "--noproxy", "*", "-m", "3", &format!("http://{addr}:{t}/")])
            .run();
        assert_ne!(run.code(), 0, "curl --noproxy reached {addr}:{t}: {}", run.stdout());
        // A TCP connect to a non-loopback address now completes — against the sandbox's own
        // capture listener (transparent capture, issue 14), which the daemon refuses; the wall
        // is that nothing reaches the host's sentinel (asserted below) and that no byte comes
        // back from it.
        let run = sb
            .exec(&[
                "bash",
                "-c",
                &format!("exec 3<>/dev/tcp/{addr}/{t} && echo x >&3 && timeout 3 head -c1 <&3"),
            ])
            .run();
        assert!(run.stdout().is_empty(), "bash /dev/tcp got an answer from {addr}:{t}");
        let code = format!(
            "import socket\n\
             s = socket.socket(); s.settimeout(3)\n\
             try:\n    s.connect(('{addr}', {t})); s.sendall(b'x'); print('CONNECTED' if s.recv(1) else 'closed')\n\
             except OSError as e: print('refused', e.errno)\n\
             u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
             try:\n    u.sendto(b'leak', ('{addr}', {u})); print('SENT')\n\
             except OSError as e: print('unsent', e.errno)\n"
        );
        let out = sb.py(&code).expect_code(0).stdout();
        assert!(!out.contains("CONNECTED"), "{addr}: {out}");
    }
    // IPv6 loopback too.
    let code = format!(
        "import socket\ns = socket.socket(socket.AF_INET6); s.settimeout(3)\n\
         try:\n    s.connect(('::1', {})); print('CONNECTED')\nexcept OSError as e: print('no', e.errno)\n",
        sentinel.tcp_port
    );
    assert!(!sb.py(&code).stdout().contains("CONNECTED"));
    sentinel.assert_untouched();
}

#[cfg(feature = "test-hooks")]
#[test]
fn only_lo_exists_and_the_only_resolver_is_the_sandboxs_own() {
    if !prereqs(&["python3"]) {
        return;
    }
    // The `hold` bridge keeps the handed-over sockets open and serves none: whatever answers a
    // query here would be a resolver other than airlockd's, so none may (the resolver's own
    // answers are tested through the daemon in tests/it/sandbox_dns.rs).
    let sb = Sandbox::new("dns");
    let code = "import socket, os\n\
        print(sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]))\n\
        print(repr(open('/etc/resolv.conf').read()))\n\
        bound = [l.split()[1] for l in open('/proc/net/udp').readlines()[1:]]\n\
        print('udp', bound)\n\
        q = bytes.fromhex('424201000001000000000000076578616d706c6503636f6d0000010001')\n\
        for dst in [('127.0.0.53', 53), ('127.0.0.1', 53)]:\n\
        \x20   s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1)\n\
        \x20   try:\n\
        \x20       s.sendto(q, dst); s.recv(512); print(dst[0], 'ANSWERED')\n\
        \x20   except OSError as e: print(dst[0], 'noanswer', type(e).__name__)\n\
        try:\n    socket.create_connection(('127.0.0.53', 53), timeout=1).close(); print('tcp53 listening')\n\
        except OSError as e: print('tcp53', e)\n";
    let out = sb.py(code).expect_code(0).stdout();
    assert!(out.starts_with("['lo']\n'nameserver 127.0.0.53\\n'\n"), "{out}");
    // 127.0.0.53:53 (0x3500007F:0035) is bound inside, by the sandbox's setup.
    assert!(out.contains("'3500007F:0035'"), "{out}");
    assert!(out.contains("127.0.0.53 noanswer"), "{out}");
    assert!(out.contains("127.0.0.1 noanswer"), "{out}");
    assert!(!out.contains("ANSWERED"), "{out}");
    // The TCP listener exists (the daemon accepts on it when it serves the session).
    assert!(out.contains("tcp53 listening"), "{out}");
}

#[cfg(feature = "test-hooks")]
#[test]
fn raw_packet_vsock_and_netlink_sockets_are_refused() {
    if !prereqs(&["python3"]) {
        return;
    }
    let sb = Sandbox::new("raw");
    let code = "import socket, errno\n\
        cases = [('raw4', socket.AF_INET, socket.SOCK_RAW, 1), ('raw6', socket.AF_INET6, socket.SOCK_RAW, 58),\n\
                 ('packet', socket.AF_PACKET, socket.SOCK_RAW, 0), ('inet_packet', socket.AF_INET, 10, 0),\n\
                 ('netlink', socket.AF_NETLINK, socket.SOCK_RAW, 0), ('vsock', 40, socket.SOCK_STREAM, 0)]\n\
        for name, fam, ty, proto in cases:\n\
        \x20   try:\n\
        \x20       socket.socket(fam, ty, proto); print(name, 'OPENED')\n\
        \x20   except OSError as e: print(name, errno.errorcode.get(e.errno))\n";
    let out = sb.py(code).expect_code(0).stdout();
    for name in ["raw4", "raw6", "packet", "inet_packet", "netlink", "vsock"] {
        assert!(out.contains(&format!("{name} EPERM")), "{name}:\n{out}");
    }
}

#[cfg(feature = "test-hooks")]
#[test]
fn daemon_socket_and_host_abstract_sockets_are_unreachable() {
    if !prereqs(&["python3"]) {
        return;
    }
    let sb = Sandbox::new("unix");
    let sock_dir = sb.home().join(".airlock");
    std::fs::create_dir_all(&sock_dir).unwrap();
    let path = sock_dir.join("airlock.sock");
    let hits = Arc::new(AtomicUsize::new(0));
    let named = UnixListener::bind(&path).unwrap();
    let abstract_name = format!("airlock-test-{}", std::process::id());
    let addr =
        <std::os::unix::net::SocketAddr as std::os::linux::net::SocketAddrExt>::from_abstract_name(
            abstract_name.as_bytes(),
        )
        .unwrap();
    let abs = UnixListener::bind_addr(&addr).unwrap();
    for l in [named, abs] {
        let h = hits.clone();
        std::thread::spawn(move || {
            for c in l.incoming() {
                if c.is_ok() {
                    h.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
    }
    let code = format!(
        "import socket\n\
         for a in ['{}', '/tmp/airlock-{}/airlock.sock', '\\0{}']:\n\
         \x20   s = socket.socket(socket.AF_UNIX)\n\
         \x20   try:\n\
         \x20       s.connect(a); print('CONNECTED', repr(a))\n\
         \x20   except OSError as e: print('no', e.errno)\n",
        path.display(),
        nix::unistd::getuid(),
        abstract_name
    );
    let out = sb.py(&code).expect_code(0).stdout();
    assert!(!out.contains("CONNECTED"), "{out}");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(hits.load(Ordering::SeqCst), 0);
}

#[cfg(feature = "test-hooks")]
#[test]
fn no_inherited_descriptor_reaches_anything() {
    if !prereqs(&["python3"]) {
        return;
    }
    let sb = Sandbox::new("fds");
    // A descriptor the caller leaks to airlock (not CLOEXEC) must not reach the command.
    let (leak_r, _leak_w) = nix::unistd::pipe().unwrap();
    let leaked = std::os::fd::AsRawFd::as_raw_fd(&leak_r);
    let code = "import os\n\
        fds = sorted(int(f) for f in os.listdir('/proc/self/fd'))\n\
        for fd in fds:\n\
        \x20   try: print(fd, os.readlink('/proc/self/fd/%d' % fd))\n\
        \x20   except OSError: pass\n";
    let out = sb.py(code).expect_code(0).stdout();
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines.len() <= 4, "{out}");
    for line in &lines {
        assert!(!line.contains("socket:"), "a socket reached the command: {out}");
        let fd: i32 = line.split(' ').next().unwrap().parse().unwrap();
        assert!(fd <= 3, "unexpected fd {line} (leaked fd was {leaked})");
    }
    // 0..2 are the relay's pipes; 3 is python's own listing of /proc/self/fd.
    assert!(lines.iter().take(3).all(|l| l.contains("pipe:")), "{out}");
    drop(leak_r);
}

#[cfg(feature = "test-hooks")]
#[test]
fn host_secrets_and_other_homes_are_invisible() {
    if !prereqs(&["python3"]) {
        return;
    }
    let sb = Sandbox::new("secrets");
    let home = sb.home().to_path_buf();
    sb.world.write(home.join(".ssh/id_ed25519"), "PRIVATE-KEY-SENTINEL");
    sb.world.write(home.join(".aws/credentials"), "AWS-SENTINEL");
    sb.world.airlock(&sb.repo).args(["login", "--email", "a@b.test"]).run().expect_code(0);
    assert!(home.join(".airlock/identity.toml").is_file());
    // A symlink in the repo pointing at the host's secrets, absolute and relative.
    std::os::unix::fs::symlink(home.join(".ssh/id_ed25519"), sb.repo.join("key")).unwrap();
    std::os::unix::fs::symlink("../home/.aws/credentials", sb.repo.join("aws")).unwrap();
    // Each read's error is printed, so the whole output is compared exactly: the home lives
    // under /var/tmp (support::world_parent), which only the mount plan hides.
    let h = home.display();
    let script = format!(
        "for f in {h}/.ssh/id_ed25519 {h}/.aws/credentials {h}/.airlock/identity.toml /etc/shadow \
         /root/.bashrc key aws; do cat $f 2>&1 && echo LEAK $f; done; ls /home; ls /root 2>&1; \
         ls {h} 2>&1; ls {parent} 2>&1; echo end",
        parent = support::world_parent().display()
    );
    let run = sb.exec(&["sh", "-c", &script]).env("AWS_SECRET_ACCESS_KEY", "ENV-SENTINEL").run();
    let out = run.expect_code(0).stdout();
    let enoent = |p: &str| format!("cat: {p}: No such file or directory\n");
    let expected = [
        enoent(&format!("{h}/.ssh/id_ed25519")),
        enoent(&format!("{h}/.aws/credentials")),
        enoent(&format!("{h}/.airlock/identity.toml")),
        enoent("/etc/shadow"),
        enoent("/root/.bashrc"),
        enoent("key"),
        enoent("aws"),
        "agent\n".to_string(),
        "ls: cannot access '/root': No such file or directory\n".to_string(),
        format!("ls: cannot access '{h}': No such file or directory\n"),
        format!(
            "ls: cannot access '{}': No such file or directory\n",
            support::world_parent().display()
        ),
        "end\n".to_string(),
    ]
    .concat();
    assert_eq!(out, expected);
    // The host environment does not come in; init's copy of it is not readable either.
    let env = sb
        .exec(&["sh", "-c", "env; cat /proc/1/environ /proc/1/cmdline 2>&1; true"])
        .env("AWS_SECRET_ACCESS_KEY", "ENV-SENTINEL")
        .run()
        .expect_code(0);
    assert!(env.stdout().lines().any(|l| l == "HOME=/home/agent"), "{}", env.stdout());
    assert!(!env.stdout().contains("ENV-SENTINEL"), "{}", env.stdout());
}

#[cfg(feature = "test-hooks")]
#[test]
fn host_processes_are_invisible_and_untraceable() {
    if !prereqs(&["python3"]) {
        return;
    }
    let sb = Sandbox::new("pids");
    let me = std::process::id();
    let code = format!(
        "import os, ctypes, errno\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n\
         print('pids', pids)\n\
         try:\n    os.kill({me}, 0); print('HOSTPID visible')\nexcept OSError as e: print('hostpid', errno.errorcode[e.errno])\n\
         try:\n    print('root1', 'same' if sorted(os.listdir('/proc/1/root/')) == sorted(os.listdir('/')) else 'DIFFERENT')\nexcept OSError as e: print('root1', errno.errorcode[e.errno])\n\
         r = libc.ptrace(16, 1, 0, 0); print('ptrace', r, errno.errorcode.get(ctypes.get_errno()))\n\
         class iov(ctypes.Structure): _fields_ = [('b', ctypes.c_void_p), ('l', ctypes.c_size_t)]\n\
         buf = ctypes.create_string_buffer(8); l = iov(ctypes.addressof(buf), 8); r_ = iov(0x400000, 8)\n\
         r = libc.process_vm_readv(1, ctypes.byref(l), 1, ctypes.byref(r_), 1, 0)\n\
         print('vm_readv', r, errno.errorcode.get(ctypes.get_errno()))\n\
         def opened(f):\n    try:\n        os.close(os.open('/proc/1/fd/' + f, os.O_RDWR)); return 'OPENED'\n    except OSError as e: return errno.errorcode[e.errno]\n\
         try:\n    listed = str(len([f for f in os.listdir('/proc/1/fd') if f not in ('0', '1', '2')]))\nexcept OSError as e: listed = errno.errorcode[e.errno]\n\
         got = [r for r in (opened(str(n)) for n in range(3, 64)) if r == 'OPENED']\n\
         print('initfds', listed, 'opened' if got else 'none')\n"
    );
    let out = sb.py(&code).expect_code(0).stdout();
    let pids = out.lines().find(|l| l.starts_with("pids")).unwrap();
    assert!(pids.starts_with("pids [1, "), "PID 1 is our init: {out}");
    assert!(!pids.contains(&format!(" {me},")) && !pids.contains(&format!(" {me}]")), "{out}");
    assert!(out.contains("hostpid ESRCH"), "{out}");
    assert!(out.contains("root1 same\n") || out.contains("root1 EACCES\n"), "{out}");
    assert!(out.contains("ptrace -1 EPERM"), "{out}");
    assert!(out.contains("vm_readv -1 EPERM"), "{out}");
    // Init holds stdio and its end of the control socket (the end report, issue 22), which the
    // sandbox cannot take: a socket does not open through /proc, and ptrace and pidfd_getfd
    // are refused.
    // Each of init's fds 3..63 is tried whether or not the listing is allowed (it is not for
    // every caller: init is not dumpable).
    let fds = out.lines().find(|l| l.starts_with("initfds")).unwrap_or_default();
    let words: Vec<&str> = fds.split_whitespace().collect();
    assert!(matches!(words.get(1), Some(&("0" | "1" | "EACCES" | "EPERM"))), "{out}");
    assert_eq!(words.get(2), Some(&"none"), "an fd of init opened from the sandbox: {out}");
}

/// SECURITY §4's EPERM list, written from the man pages and x86_64's
/// arch/x86/entry/syscalls/syscall_64.tbl (not from `src/sandbox/seccomp.rs`): name, number,
/// arguments (a Python expression), and what a capability-less caller gets from this machine
/// kind's kernel (6.x) *without* the filter. The arguments are chosen so the kernel fails
/// early with something other than EPERM (a bad fd, pointer, pid or flag), so an EPERM here
/// is the filter's. Where the kernel checks a capability before anything else ("EPERM"), EPERM
/// is necessary but not sufficient; the BPF unit tests in seccomp.rs cover those.
const DENIED_SYSCALLS: &[(&str, u32, &str)] = &[
    ("io_uring_setup", 425, "0, BAD"), // unfiltered: EFAULT; io_uring_setup(2): params copied first
    ("io_uring_enter", 426, "-1, 0, 0, 0, 0, 0"), // unfiltered: EBADF
    ("io_uring_register", 427, "-1, 0, 0, 0"), // unfiltered: EINVAL
    ("ptrace", 101, "1, NOPID, 0, 0"), // unfiltered: ESRCH; PTRACE_PEEKTEXT of no process
    ("process_vm_readv", 310, "NOPID, 0, 0, 0, 0, 0"), // unfiltered: OK; zero iovecs: nothing to do
    ("process_vm_writev", 311, "NOPID, 0, 0, 0, 0, 0"), // unfiltered: OK
    ("pidfd_getfd", 438, "-1, 0, 0"),  // unfiltered: EBADF
    ("setns", 308, "-1, 0"),           // unfiltered: EBADF
    ("mount", 165, "BAD, BAD, BAD, 0, 0"), // unfiltered: EFAULT; mount(2) copies its strings first
    ("umount2", 166, "BAD, 0xffff"),   // unfiltered: EINVAL; unknown flags
    ("pivot_root", 155, "BAD, BAD"),   // unfiltered: EPERM
    ("fsopen", 430, "BAD, 0xffff"),    // unfiltered: EPERM
    ("fsconfig", 431, "-1, 0xffff, 0, 0, 0"), // unfiltered: EINVAL
    ("fsmount", 432, "-1, 0xffff, 0"), // unfiltered: EPERM
    ("move_mount", 429, "-1, BAD, -1, BAD, 0xffffffff"), // unfiltered: EPERM
    ("open_tree", 428, "-100, BAD, 0"), // unfiltered: EFAULT
    ("open_tree_attr", 467, "-100, BAD, 0, 0, 0"), // unfiltered: EFAULT; ENOSYS before Linux 6.15
    ("mount_setattr", 442, "-1, BAD, 0xffffffff, 0, 0"), // unfiltered: EINVAL
    ("bpf", 321, "0xffff, 0, 0"),      // unfiltered: EINVAL; unknown command
    ("keyctl", 250, "0xffff, 0, 0, 0, 0"), // unfiltered: ENOTSUP
    ("add_key", 248, "BAD, BAD, 0, 0, 0"), // unfiltered: EFAULT
    ("request_key", 249, "BAD, BAD, 0, 0"), // unfiltered: EFAULT
    ("perf_event_open", 298, "BAD, 0, -1, -1, 0"), // unfiltered: EFAULT
    ("userfaultfd", 323, "0xfffe | 1"), // unfiltered: EINVAL; UFFD_USER_MODE_ONLY + unknown flags
    ("kexec_load", 246, "0, 0, 0, 0xffffffff"), // unfiltered: EPERM or ENOSYS
    ("kexec_file_load", 320, "-1, -1, 0, 0, 0xffffffff"), // unfiltered: EPERM or ENOSYS
    ("init_module", 175, "BAD, 0, BAD"), // unfiltered: EPERM or ENOSYS
    ("finit_module", 313, "-1, BAD, 0xffffffff"), // unfiltered: EPERM or ENOSYS
    ("delete_module", 176, "BAD, 0xffffffff"), // unfiltered: EPERM or ENOSYS
    ("reboot", 169, "0, 0, 0, 0"),     // unfiltered: EPERM
    ("swapon", 167, "BAD, 0"),         // unfiltered: EPERM
    ("swapoff", 168, "BAD"),           // unfiltered: EPERM
    ("acct", 163, "BAD"),              // unfiltered: EPERM
];

/// The rest of SECURITY §4's prologue and flag rules, by raw number: (name, number,
/// arguments, expected).
const OTHER_REFUSALS: &[(&str, u32, &str, &str)] = &[
    ("clone3", 435, "0, 0", "ENOSYS"),
    ("unshare_user", 272, "0x10000000", "EPERM"),
    ("unshare_net", 272, "0x40000000", "EPERM"),
    ("unshare_mnt", 272, "0x20000", "EPERM"),
    ("clone_newuser", 56, "0x10000000 | 17, 0, 0, 0, 0", "EPERM"),
    ("unknown", 999, "", "ENOSYS"),
    ("x32_getpid", 0x4000_0000 | 39, "", "EPERM"),
];

#[cfg(feature = "test-hooks")]
#[cfg(target_arch = "x86_64")]
#[test]
fn kernel_attack_surface_syscalls_are_refused() {
    if !prereqs(&["python3"]) {
        return;
    }
    assert_eq!(DENIED_SYSCALLS.len(), 33, "SECURITY §4 names 33 calls");
    let sb = Sandbox::new("syscalls");
    let mut code = String::from(
        "import ctypes, errno\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         libc.syscall.restype = ctypes.c_long\n\
         BAD = 1  # nothing is mapped at address 1\n\
         NOPID = 0x3ffffff0  # above PID_MAX_LIMIT\n\
         def sc(name, nr, *args):\n\
         \x20   ctypes.set_errno(0)\n\
         \x20   r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])\n\
         \x20   e = ctypes.get_errno()\n\
         \x20   print(name, 'OK' if r >= 0 else errno.errorcode.get(e, e), flush=True)\n",
    );
    let mut expected = String::new();
    for (name, nr, args) in DENIED_SYSCALLS {
        code.push_str(&format!("sc('{name}', {nr}, {args})\n"));
        expected.push_str(&format!("{name} EPERM\n"));
    }
    for (name, nr, args, want) in OTHER_REFUSALS {
        code.push_str(&format!("sc('{name}', {nr}, {args})\n"));
        expected.push_str(&format!("{name} {want}\n"));
    }
    code.push_str("print('done')\n");
    expected.push_str("done\n");
    let out = sb.py(&code).expect_code(0).stdout();
    assert_eq!(out, expected);
}

/// The host tree is detached whole during setup (one lazy unmount of the setup root, the host
/// tree under it included): the sandbox's mount table holds only its own tree.
#[cfg(feature = "test-hooks")]
#[test]
fn the_mount_table_holds_only_the_sandboxs_own_tree() {
    if !prereqs(&["cat"]) {
        return;
    }
    let sb = Sandbox::new("mounttable");
    let out = sb.sh("cat /proc/self/mountinfo").expect_code(0).stdout();
    let allowed = [
        "/usr",
        "/bin",
        "/sbin",
        "/lib",
        "/etc/",
        "/tmp",
        "/home/agent",
        "/dev",
        "/proc",
        "/mounttable",
        "/opt/airlock",
    ];
    let points: Vec<&str> = out.lines().filter_map(|l| l.split(' ').nth(4)).collect();
    assert!(points.len() >= 10 && points.len() <= 80, "{out}");
    assert_eq!(points.iter().filter(|p| **p == "/").count(), 1, "{out}");
    for p in points.iter().filter(|p| **p != "/") {
        assert!(allowed.iter().any(|a| p.starts_with(a)), "unexpected mount {p} inside:\n{out}");
    }
    assert!(!out.contains("oldroot") && !out.contains("newroot"), "{out}");
}

#[cfg(feature = "test-hooks")]
#[test]
fn nested_unshare_and_remounts_fail() {
    if !prereqs(&["unshare", "mount", "touch"]) {
        return;
    }
    let sb = Sandbox::new("nested");
    // Each attempt's exit status and message, and a first line proving the script ran inside:
    // unshare(2) is EPERM (seccomp), the remount is refused, and /usr stays read-only.
    let run = sb.sh(
        "echo \"inside $(hostname)\"; unshare -Ur true 2>&1; echo u=$?; unshare -n true 2>&1; \
         echo n=$?; mount -o remount,rw /usr 2>/dev/null; echo m=$?; touch /usr/x 2>&1; echo t=$?",
    );
    let out = run.expect_code(0).stdout();
    assert_eq!(
        out,
        "inside nested\n\
         unshare: unshare failed: Operation not permitted\nu=1\n\
         unshare: unshare failed: Operation not permitted\nn=1\n\
         m=32\n\
         touch: cannot touch '/usr/x': Read-only file system\nt=1\n"
    );
}

#[cfg(feature = "test-hooks")]
#[test]
fn tiocsti_cannot_inject_with_stdout_a_tty_and_stdin_a_pipe() {
    if !prereqs(&["python3"]) {
        return;
    }
    let sb = Sandbox::new("tty");
    let pty = nix::pty::openpty(None, None).unwrap();
    let slave: OwnedFd = pty.slave;
    let code = "import fcntl, termios, errno, os, sys\n\
        res = []\n\
        for fd in (0, 1, 2):\n\
        \x20   try:\n\
        \x20       fcntl.ioctl(fd, termios.TIOCSTI, b'x'); res.append('INJECTED')\n\
        \x20   except OSError as e: res.append(errno.errorcode[e.errno])\n\
        try:\n\
        \x20   t = os.open('/dev/tty', os.O_RDWR); fcntl.ioctl(t, termios.TIOCSTI, b'x'); res.append('INJECTED')\n\
        except OSError as e: res.append(errno.errorcode[e.errno])\n\
        print(' '.join(res), os.isatty(0), os.isatty(1))\n";
    let mut cmd = sb.exec(&["python3", "-c", code]).cmd;
    cmd.stdin(Stdio::piped()).stdout(Stdio::from(slave)).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    drop(cmd);
    drop(child.stdin.take());
    let mut master = std::fs::File::from(pty.master);
    let status = child.wait().unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    // The pty's output is complete once the child exited; read what is buffered.
    nix::fcntl::fcntl(&master, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK))
        .unwrap();
    while let Ok(n) = master.read(&mut buf) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    let out = String::from_utf8_lossy(&out);
    assert_eq!(status.code(), Some(0), "{out}");
    assert!(!out.contains("INJECTED"), "{out}");
    assert!(out.contains("EPERM"), "{out}");
    assert!(out.contains("False True"), "stdin a pipe, stdout a pty: {out}");
}

#[cfg(feature = "test-hooks")]
#[test]
fn writes_land_only_in_repo_home_and_tmp() {
    let sb = Sandbox::new("writes");
    let out = sb
        .sh("for p in /usr/x /etc/x /x /bin/x /lib/x /dev/x /home/x /proc/sys/vm/drop_caches /run/x; do \
             (echo 1 > $p) 2>/dev/null && echo WROTE $p; done; \
             echo repo > /writes/from-inside && echo tmp > /tmp/t && echo home > $HOME/h && \
             cat /tmp/t $HOME/h")
        .expect_code(0)
        .stdout();
    assert!(!out.contains("WROTE"), "{out}");
    assert_eq!(out, "tmp\nhome\n");
    assert_eq!(std::fs::read_to_string(sb.repo.join("from-inside")).unwrap(), "repo\n");
}

pub(crate) fn git(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new("git")
        .current_dir(dir)
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.test",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .output()
        .unwrap()
}

#[cfg(feature = "test-hooks")]
#[test]
fn protected_paths_cannot_be_planted_and_new_ones_are_quarantined() {
    if !prereqs(&["git"]) {
        return;
    }
    let world = World::new();
    let repo = world.tmp.path().join("prot");
    std::fs::create_dir_all(&repo).unwrap();
    assert!(git(&repo, &["init", "-q"]).status.success());
    world.write(repo.join("README"), "hi\n");
    world.write(repo.join(".airlock.toml"), "[network]\nallow = [\"example.test\"]\n");
    std::fs::create_dir_all(repo.join(".claude")).unwrap();
    world.write(repo.join(".claude/settings.json"), "{}");
    assert!(git(&repo, &["add", "-A"]).status.success());
    assert!(git(&repo, &["commit", "-qm", "init"]).status.success());
    let sb = Sandbox::with(world, repo.clone());
    sb.trust();
    let marker = sb.world.tmp.path().join("PLANTED-RAN");
    let hook = format!("#!/bin/sh\ntouch {}\n", marker.display());
    // Every protected path, present or absent at the start, is unusable inside: present ones
    // are read-only binds, absent top-level ones are read-only placeholders. (`.git/config` is
    // writable as a private copy merged back through an allowlist: `sandbox_gitconfig`.)
    let script = format!(
        "cd /prot; r=''; \
         printf '{hook}' > .git/hooks/post-checkout 2>/dev/null && r=\"$r hook\"; \
         chmod +x .git/hooks/post-checkout 2>/dev/null; \
         echo 'allow=[\"*\"]' >> .airlock.toml 2>/dev/null && r=\"$r airlock\"; \
         echo '{{}}' > .claude/settings.json 2>/dev/null && r=\"$r claude\"; \
         mv .git .git-away 2>/dev/null && r=\"$r mvgit\"; \
         mv .claude .claude-away 2>/dev/null && r=\"$r mvclaude\"; \
         rm -rf .git/hooks 2>/dev/null; [ -d .git/hooks ] || r=\"$r rmhooks\"; \
         printf 'touch {m}\\n' > .envrc 2>/dev/null && r=\"$r envrc\"; \
         printf '{{}}' > .mcp.json 2>/dev/null && r=\"$r mcp\"; \
         mkdir -p .vscode/x 2>/dev/null && r=\"$r vscode\"; \
         echo '{{}}' > .vscode/tasks.json 2>/dev/null && r=\"$r tasks\"; \
         rm -rf .vscode .envrc 2>/dev/null; [ -e .vscode ] && [ -e .envrc ] || r=\"$r rmplaceholder\"; \
         echo '{{}}' > .claude/settings.local.json 2>/dev/null && r=\"$r claudelocal\"; \
         echo 'repos: []' > .pre-commit-config.yaml 2>/dev/null && r=\"$r precommit\"; \
         mkdir .devcontainer/x 2>/dev/null && r=\"$r devcontainer\"; \
         echo result:$r",
        m = marker.display()
    );
    let out = sb.exec(&["sh", "-c", &script]).run().expect_code(0);
    let stdout = out.stdout();
    assert!(stdout.contains("result:\n"), "a protected path was writable: {stdout}");
    // The placeholders are gone again, and nothing needed quarantining.
    for path in [".envrc", ".mcp.json", ".vscode", ".claude/settings.local.json", ".devcontainer"] {
        assert!(std::fs::symlink_metadata(repo.join(path)).is_err(), "{path} left in the repo");
    }
    assert!(!out.stderr().contains("quarantined"), "{}", out.stderr());
    assert!(repo.join(".git").is_dir() && repo.join(".claude/settings.json").is_file());
    // The host's next git checkout runs nothing planted.
    assert!(git(&repo, &["checkout", "-q", "-b", "next"]).status.success());
    assert!(!marker.exists(), "a planted hook ran on the host");
    assert_eq!(std::fs::read_to_string(repo.join(".claude/settings.json")).unwrap(), "{}");
}

/// Makes `dir` take no new entries (`on`) or take them again: root ignores directory
/// permissions, so for root the immutable flag (ext4, chattr(1)); mode 0555 otherwise.
fn lock_dir(dir: &Path, on: bool) {
    if nix::unistd::geteuid().is_root() {
        let flag = if on { "+i" } else { "-i" };
        let ok = Command::new("chattr").arg(flag).arg(dir).status().unwrap().success();
        assert!(ok, "chattr {flag} {} (the suite needs ext4 here)", dir.display());
    } else {
        use std::os::unix::fs::PermissionsExt;
        let mode = if on { 0o555 } else { 0o755 };
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).unwrap();
    }
}

/// Issue 22: the placeholders are made while init sets up its namespaces, from a mount plan
/// that expects every one of them. In a repo where none can be made (its directory does not
/// take new entries) that init must never mount its plan, which binds placeholders that do not
/// exist: a second init gets the plan the scan and the failures gave, and the session runs.
#[cfg(feature = "test-hooks")]
#[test]
fn placeholders_that_cannot_be_made_still_start_the_session_with_the_plan_they_gave() {
    let sb = Sandbox::new("locked");
    sb.world.write(sb.repo.join("README"), "hi\n");
    lock_dir(&sb.repo, true);
    let out = sb.sh("cat README; echo ran");
    lock_dir(&sb.repo, false);
    let out = out.expect_code(0);
    assert_eq!(out.stdout(), "hi\nran\n", "{}", out.stderr());
    assert!(out.stderr().contains(".envrc could not be made unusable"), "{}", out.stderr());
    let mut names: Vec<String> = std::fs::read_dir(&sb.repo)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, [".git", "README"], "the session left something in the repo");
}

/// Issue 22, across sessions: a session whose init was forked again (the placeholders under a
/// `.claude` that takes no new entries could not be made) keeps every wall. It tries to plant
/// what the host runs; then the host's own `git checkout` runs nothing, and the next session
/// (every placeholder made this time) starts and finds no plant.
#[cfg(feature = "test-hooks")]
#[test]
fn a_reforked_session_plants_nothing_the_host_or_the_next_session_runs() {
    if !prereqs(&["git"]) {
        return;
    }
    let world = World::new();
    let repo = world.tmp.path().join("refork");
    std::fs::create_dir_all(repo.join(".claude")).unwrap();
    assert!(git(&repo, &["init", "-q"]).status.success());
    world.write(repo.join("README"), "hi\n");
    assert!(git(&repo, &["add", "-A"]).status.success());
    assert!(git(&repo, &["commit", "-qm", "init"]).status.success());
    let sb = Sandbox::with(world, repo.clone());
    let marker = sb.world.tmp.path().join("PLANTED-RAN");
    let m = marker.display();
    let script = format!(
        "r=''; \
         printf '#!/bin/sh\\ntouch {m}\\n' > .git/hooks/post-checkout 2>/dev/null && r=\"$r hook\"; \
         chmod +x .git/hooks/post-checkout 2>/dev/null; \
         printf 'touch {m}\\n' > .envrc 2>/dev/null && r=\"$r envrc\"; \
         mkdir -p .vscode/x 2>/dev/null && r=\"$r vscode\"; \
         echo '{{}}' > .claude/settings.json 2>/dev/null && r=\"$r claude\"; \
         mkdir -p sub && printf 'touch {m}\\n' > sub/.envrc && r=\"$r nested\"; \
         echo result:$r"
    );
    lock_dir(&repo.join(".claude"), true);
    let out = sb.sh(&script);
    lock_dir(&repo.join(".claude"), false);
    let out = out.expect_code(0);
    // The re-fork happened (the placeholders under `.claude` could not be made) and only the
    // nested file, which the sweep takes away, could be written.
    assert!(
        out.stderr().contains(".claude/settings.json could not be made unusable"),
        "{}",
        out.stderr()
    );
    assert!(out.stdout().contains("result: nested\n"), "{}\n{}", out.stdout(), out.stderr());
    assert!(out.stderr().contains("quarantined"), "{}", out.stderr());
    assert!(!repo.join("sub/.envrc").exists(), "the nested plant is still in the repo");
    // Step two: the host's own git, then the next session.
    assert!(git(&repo, &["checkout", "-q", "-b", "next"]).status.success());
    assert!(!marker.exists(), "a planted hook ran on the host");
    let next = sb.sh("[ -s .envrc ] && echo planted-envrc; ls -A sub 2>/dev/null; echo next-ran");
    let next = next.expect_code(0);
    assert_eq!(next.stdout(), "next-ran\n", "{}", next.stderr());
    assert!(!next.stderr().contains("could not be made unusable"), "{}", next.stderr());
    assert!(!marker.exists());
    for path in [".envrc", ".vscode", ".mcp.json", ".claude/settings.json"] {
        assert!(std::fs::symlink_metadata(repo.join(path)).is_err(), "{path} left in the repo");
    }
}

#[cfg(feature = "test-hooks")]
#[test]
fn untrusted_repo_config_refuses_without_a_terminal() {
    let sb = Sandbox::new("untrusted");
    sb.world.write(sb.repo.join(".airlock.toml"), "[network]\nallow = [\"example.test\"]\n");
    let run = sb.exec(&["true"]).run().expect_code(125);
    assert!(run.stderr().starts_with("airlock: "), "{}", run.stderr());
    assert!(run.stderr().contains("airlock policy trust"), "{}", run.stderr());
    sb.trust();
    sb.exec(&["true"]).run().expect_code(0);
    sb.world.write(sb.repo.join(".airlock.toml"), "[network]\nallow = [\"*.test\"]\n");
    sb.exec(&["true"]).run().expect_code(125);
}

#[cfg(feature = "test-hooks")]
#[test]
fn stdin_pipes_through_and_exit_codes_propagate() {
    let sb = Sandbox::new("codes");
    let mut cmd = sb.exec(&["cat"]).cmd;
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    child.stdin.take().unwrap().write_all(b"hi\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hi\n");
    assert_eq!(out.status.code(), Some(0));

    sb.sh("exit 3").expect_code(3);
    sb.sh("kill -TERM $$").expect_code(143);
    // Output still in flight when the command ends: the code is the command's, not that of
    // init's end (which may be reaped while the output drains).
    sb.sh("head -c 4000000 /dev/zero; exit 3").expect_code(3);
    let run = sb.exec(&["no-such-command-xyz"]).run().expect_code(127);
    assert!(run.stderr().contains("airlock: no-such-command-xyz"), "{}", run.stderr());
    sb.world.write(sb.repo.join("script.sh"), "#!/bin/sh\necho no\n");
    sb.exec(&["./script.sh"]).run().expect_code(126);
    // A usage error is Airlock's own failure (125, like `docker run`), never a child status.
    sb.world.airlock(&sb.repo).args(["exec"]).run().expect_code(125);
}

/// What the command leaves running ends with it: init kills and reaps every other process of
/// the session before it reports the command's end, and the end-of-session sweep starts only
/// then (issue 22), so nothing written later escapes it. The background job below outlives the
/// command by half a second; against an init that let it run to its end before reporting, its
/// file (and the directory and `.envrc` it makes) appeared unjudged.
#[cfg(feature = "test-hooks")]
#[test]
fn a_process_the_command_leaves_running_ends_with_it_and_writes_nothing_later() {
    let sb = Sandbox::new("leftrunning");
    sb.sh("setsid sh -c 'sleep 0.5; echo late > late; mkdir -p sub; echo x > sub/.envrc' \
         </dev/null >/dev/null 2>&1 & echo started")
        .expect_code(0);
    std::thread::sleep(Duration::from_millis(1500));
    for name in ["late", "sub"] {
        assert!(!sb.repo.join(name).exists(), "{name} was written after the command ended");
    }
    // The same session's background job is killed however it detached (a double fork).
    sb.sh("( ( sleep 0.5; echo late > late2 ) & ) ; true").expect_code(0);
    std::thread::sleep(Duration::from_millis(1500));
    assert!(!sb.repo.join("late2").exists(), "late2 was written after the command ended");
}

#[cfg(feature = "test-hooks")]
#[test]
fn stdin_pipe_with_stdout_on_a_terminal() {
    let sb = Sandbox::new("ptyout");
    let pty = nix::pty::openpty(None, None).unwrap();
    let mut cmd = sb.exec(&["cat"]).cmd;
    cmd.stdin(Stdio::piped()).stdout(Stdio::from(pty.slave)).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    drop(cmd);
    child.stdin.take().unwrap().write_all(b"hi\n").unwrap();
    let mut reader = BufReader::new(std::fs::File::from(pty.master));
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert_eq!(line.trim_end(), "hi");
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

#[cfg(feature = "test-hooks")]
#[test]
fn sigint_reaches_the_command() {
    if !prereqs(&["python3"]) {
        return;
    }
    let sb = Sandbox::new("sigint");
    // The handler writes with os.write: a print() could be re-entered if the signal lands
    // while print('ready') is still returning.
    let code = "import os, signal, sys, time\n\
        def h(s, f):\n    os.write(1, b'got SIGINT\\n'); os._exit(42)\n\
        signal.signal(signal.SIGINT, h)\n\
        print('ready', flush=True)\n\
        time.sleep(30)\n";
    let mut cmd = sb.exec(&["python3", "-c", code]).cmd;
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::SIGINT)
        .unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "got SIGINT\n");
    assert_eq!(child.wait().unwrap().code(), Some(42));
}

#[cfg(feature = "test-hooks")]
#[test]
fn dev_server_on_loopback_inside_is_reachable_from_inside() {
    if !prereqs(&["python3", "curl"]) {
        return;
    }
    let sb = Sandbox::new("devserver");
    sb.world.write(sb.repo.join("index.html"), "dev-server-ok\n");
    let out = sb
        .sh("python3 -m http.server 9000 --bind 127.0.0.1 >/dev/null 2>&1 & \
             for i in $(seq 50); do curl -s http://127.0.0.1:9000/index.html && exit 0; sleep 0.1; done; exit 1")
        .expect_code(0)
        .stdout();
    assert_eq!(out, "dev-server-ok\n");
}

#[cfg(feature = "test-hooks")]
#[test]
fn proxy_listener_is_handed_to_the_host_side() {
    if !prereqs(&["curl"]) {
        return;
    }
    let sb = Sandbox::new("proxy");
    // curl goes through HTTP_PROXY (127.0.0.1:8888 inside); the test bridge on the host side
    // answers, which proves the listener made inside the netns reached the supervisor. The
    // target name is never resolved.
    let run = sb
        .world
        .airlock(&sb.repo)
        .hook("AIRLOCK_TEST_PROXY_BRIDGE", "respond")
        .args(["exec", "--", "sh", "-c", "echo $HTTP_PROXY; curl -sS -m 5 http://example.test/"])
        .run()
        .expect_code(0);
    let out = run.stdout();
    assert!(out.starts_with("http://127.0.0.1:8888\n"), "{out}");
    assert!(out.contains("airlock-test-bridge session="), "{out}");
}

#[cfg(feature = "test-hooks")]
#[test]
fn environment_is_the_minimal_base() {
    let sb = Sandbox::new("envbase");
    let run = sb
        .exec(&["env"])
        .env("GITHUB_TOKEN", "ghp-sentinel")
        .env("TERM", "xterm-test")
        .run()
        .expect_code(0);
    let mut names: Vec<String> = run
        .stdout()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, _)| k.to_string())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "AIRLOCK_REPO",
            "HOME",
            "HTTPS_PROXY",
            "HTTP_PROXY",
            "LANG",
            "NO_PROXY",
            "PATH",
            "TERM",
            "http_proxy",
            "https_proxy",
            "no_proxy"
        ]
    );
    assert!(run.stdout().contains("TERM=xterm-test\n"));
    assert!(run.stdout().contains("PATH=/usr/local/bin:/usr/bin:/bin\n"));
    assert!(run.stdout().contains("AIRLOCK_REPO=/envbase\n"));
}

#[cfg(feature = "test-hooks")]
#[test]
fn identity_and_env_pass_come_in_from_trusted_layers_only() {
    let sb = Sandbox::new("envpass");
    sb.world.write(
        sb.home().join(".airlock/config.toml"),
        "[network]\nallow = [\"example.test\"]\n[env]\npass = [\"PASSED_VAR\"]\n",
    );
    sb.world.airlock(&sb.repo).args(["login", "--email", "dev@example.test"]).run().expect_code(0);
    let run = sb
        .exec(&["env"])
        .env("PASSED_VAR", "passed-value")
        .env("OTHER_VAR", "other-sentinel")
        .run()
        .expect_code(0);
    let out = run.stdout();
    assert!(out.contains("PASSED_VAR=passed-value\n"), "{out}");
    assert!(!out.contains("other-sentinel"), "{out}");
    assert!(out.contains("AIRLOCK_USER_EMAIL=dev@example.test\n"), "{out}");
    assert!(out.lines().any(|l| l.starts_with("AIRLOCK_USER_ID=u_")), "{out}");
}

#[cfg(feature = "test-hooks")]
#[test]
fn reserved_repo_names_are_mounted_under_workspace() {
    let sb = Sandbox::new("etc");
    let out = sb.sh("pwd; hostname; ls /etc/passwd").expect_code(0).stdout();
    assert_eq!(out, "/workspace/etc\netc\n/etc/passwd\n");
}

#[cfg(feature = "test-hooks")]
#[test]
fn apparmor_restriction_is_detected_with_the_fix() {
    let sb = Sandbox::new("apparmor");
    let fake = sb.world.tmp.path().join("probe");
    sb.world.write(fake.join("proc/sys/kernel/apparmor_restrict_unprivileged_userns"), "1\n");
    sb.world.write(fake.join("proc/self/attr/apparmor/current"), "unconfined\n");
    let run = sb.exec(&["true"]).hook("AIRLOCK_TEST_PROBE_ROOT", &fake).run();
    if nix::unistd::getuid().is_root() {
        // The restriction does not apply to root.
        run.expect_code(0);
    } else {
        let run = run.expect_code(125);
        assert!(run.stderr().contains("apparmor_restrict_unprivileged_userns"), "{}", run.stderr());
        assert!(run.stderr().contains("contrib/apparmor/airlock"), "{}", run.stderr());
    }
    // A mandatory layer missing refuses in every mode.
    sb.world.write(fake.join("proc/sys/user/max_user_namespaces"), "0\n");
    let run = sb.exec(&["true"]).hook("AIRLOCK_TEST_PROBE_ROOT", &fake).run().expect_code(125);
    assert!(run.stderr().contains("max_user_namespaces"), "{}", run.stderr());
}

#[cfg(feature = "test-hooks")]
#[test]
fn worktree_gitdir_outside_the_repo_is_usable_and_its_hooks_protected() {
    if !prereqs(&["git"]) {
        return;
    }
    let world = World::new();
    let main = world.tmp.path().join("main");
    std::fs::create_dir_all(&main).unwrap();
    assert!(git(&main, &["init", "-q"]).status.success());
    world.write(main.join("f"), "x\n");
    assert!(git(&main, &["add", "-A"]).status.success());
    assert!(git(&main, &["commit", "-qm", "c"]).status.success());
    let wt = world.tmp.path().join("wt");
    assert!(git(&main, &["worktree", "add", "-q", wt.to_str().unwrap()]).status.success());
    let sb = Sandbox::with(world, wt);
    // The worktree's `gitdir:` pointer is honoured only once `airlock policy trust` recorded it.
    let refused = sb.exec(&["true"]).run().expect_code(125);
    let err = refused.stderr();
    assert!(err.contains(&format!("{}", sb.repo.join(".git").display())), "{err}");
    assert!(err.contains("airlock policy trust"), "{err}");
    let trusted = sb.world.airlock(&sb.repo).args(["policy", "trust"]).run().expect_code(0);
    assert!(trusted.stdout().contains("recorded git pointer"), "{}", trusted.stdout());
    let hooks = main.join(".git/hooks");
    let script = format!(
        "git status --short >/dev/null && echo git-ok; \
         echo x > {h}/post-checkout 2>/dev/null && echo HOOK-WRITTEN; true",
        h = hooks.display()
    );
    let out = sb.exec(&["sh", "-c", &script]).run().expect_code(0).stdout();
    assert!(out.contains("git-ok"), "{out}");
    assert!(!out.contains("HOOK-WRITTEN"), "{out}");
}

#[test]
fn exec_refuses_cleanly_outside_a_directory_repo() {
    let sb = Sandbox::new("norepo");
    let file = sb.world.write(sb.world.tmp.path().join("afile"), "");
    let run = sb
        .world
        .airlock(&sb.repo)
        .args(["exec", "--repo"])
        .arg_path(&file)
        .args(["--", "true"])
        .run()
        .expect_code(125);
    assert!(run.stderr().starts_with("airlock: --repo"), "{}", run.stderr());
}

trait ArgPath {
    fn arg_path(self, p: &Path) -> Self;
}
impl ArgPath for support::TestCommand {
    fn arg_path(mut self, p: &Path) -> Self {
        self.cmd.arg(p);
        self
    }
}

#[cfg(feature = "test-hooks")]
#[test]
fn a_terminal_is_relayed_through_a_private_pty() {
    let sb = Sandbox::new("ptyin");
    let pty = nix::pty::openpty(None, None).unwrap();
    let slave = std::fs::File::from(pty.slave);
    let mut cmd = sb.exec(&["sh", "-c", "tty; read x; echo got:$x"]).cmd;
    cmd.stdin(slave.try_clone().unwrap()).stdout(slave.try_clone().unwrap()).stderr(slave);
    let mut child = cmd.spawn().unwrap();
    drop(cmd);
    let mut master = std::fs::File::from(pty.master);
    let mut out = PtyOutput::read(&master);
    // The command's terminal is a pty of the sandbox's own devpts instance (numbered from 0).
    out.wait_for(b"/dev/pts/0");
    master.write_all(b"abc\r").unwrap();
    out.wait_for(b"got:abc");
    assert_eq!(child.wait().unwrap().code(), Some(0), "{}", out.seen.escape_ascii());
}

#[cfg(feature = "test-hooks")]
#[test]
fn untrusted_repo_config_asks_on_a_terminal() {
    let sb = Sandbox::new("asktrust");
    sb.world.write(sb.repo.join(".airlock.toml"), "[network]\nallow = [\"asked.example.test\"]\n");
    let pty = nix::pty::openpty(None, None).unwrap();
    let slave = std::fs::File::from(pty.slave);
    let mut cmd = sb.exec(&["sh", "-c", "echo ran-after-trust"]).cmd;
    cmd.stdin(slave.try_clone().unwrap()).stdout(slave.try_clone().unwrap()).stderr(slave);
    let mut child = cmd.spawn().unwrap();
    drop(cmd);
    let mut master = std::fs::File::from(pty.master);
    let mut out = PtyOutput::read(&master);
    // The difference is shown before the question.
    out.wait_for(b"asked.example.test");
    out.wait_for(b"[y/N]");
    master.write_all(b"y\n").unwrap();
    out.wait_for(b"ran-after-trust");
    assert_eq!(child.wait().unwrap().code(), Some(0), "{}", out.seen.escape_ascii());
    // Trusted now: a non-interactive run applies it without asking.
    sb.exec(&["true"]).run().expect_code(0);
}

#[test]
fn a_repo_containing_home_or_airlock_state_is_refused() {
    let sb = Sandbox::new("inner");
    let run = sb
        .world
        .airlock(&sb.repo)
        .args(["exec", "--repo"])
        .arg_path(sb.world.tmp.path())
        .args(["--", "true"])
        .run()
        .expect_code(125);
    assert!(run.stderr().contains("refusing to run with --repo"), "{}", run.stderr());
    sb.world
        .airlock(&sb.repo)
        .args(["exec", "--repo"])
        .arg_path(sb.home())
        .args(["--", "true"])
        .run()
        .expect_code(125);
}

#[cfg(feature = "test-hooks")]
#[test]
fn doctor_shows_the_kernel_probes_exec_decides_with() {
    let sb = Sandbox::new("doctor");
    let fake = sb.world.tmp.path().join("probe");
    sb.world.write(fake.join("proc/sys/kernel/apparmor_restrict_unprivileged_userns"), "1\n");
    sb.world.write(fake.join("proc/self/attr/apparmor/current"), "unconfined\n");
    let run = sb
        .world
        .airlock(&sb.repo)
        .hook("AIRLOCK_TEST_PROBE_ROOT", &fake)
        .args(["doctor", "--json"])
        .run();
    let checks: serde_json::Value = serde_json::from_str(&run.stdout()).unwrap();
    let kernel: Vec<&serde_json::Value> =
        checks.as_array().unwrap().iter().filter(|c| c["area"] == "kernel").collect();
    let find = |name: &str| {
        *kernel.iter().find(|c| c["detail"].as_str().unwrap().starts_with(name)).unwrap()
    };
    assert_eq!(find("seccomp")["level"], "ok", "{kernel:?}");
    assert_eq!(find("user namespaces")["level"], "ok", "{kernel:?}");
    let apparmor = find("apparmor userns restriction");
    if nix::unistd::getuid().is_root() {
        assert_eq!(apparmor["level"], "ok");
    } else {
        assert_eq!(apparmor["level"], "fail");
        assert!(apparmor["fix"].as_str().unwrap().contains("contrib/apparmor/airlock"));
    }
    assert!(find("landlock")["detail"].as_str().unwrap().starts_with("landlock: ABI"));
    // The capture probe tried the TCP redirect and the UDP refusal with its log socket (one
    // refused datagram reported) in throwaway namespaces; this kernel has them all.
    let capture = find("transparent capture");
    assert_eq!(capture["level"], "ok", "{capture}");
    assert!(capture["detail"].as_str().unwrap().contains("UDP"), "{capture}");
}

/// `0::` line of `/proc/PID/cgroup` (the cgroup v2 path, relative to our cgroup namespace).
fn cgroup_v2_of(pid: u32) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    text.lines().find_map(|l| l.strip_prefix("0::")).unwrap().to_string()
}

/// Issue 5, "cgroup v2 limits where a delegated slice exists": decided per what the probe
/// (through `doctor`) says this machine offers, and each case checked for real:
/// - delegated with pids+memory: the session's leaf has the limits, a fork past `pids.max`
///   fails with EAGAIN, and the leaf is gone afterwards;
/// - delegated without those controllers (a hybrid v1/v2 host, e.g. this CI machine as root) or
///   with them but shared with other processes (the test binary itself, unless it runs alone in
///   a delegated scope): the leaf still exists (init born in it, the sandbox's cgroup root), a
///   warning says why limits are not applied, and it is removed afterwards;
/// - not delegated (e.g. the unprivileged CI user): the warning, and the session runs.
#[cfg(feature = "test-hooks")]
#[test]
fn session_cgroup_is_applied_where_delegated_and_removed_after() {
    if !prereqs(&["python3"]) {
        return;
    }
    let sb = Sandbox::new("cgroup");
    let doctor = sb.world.airlock(&sb.repo).args(["doctor", "--json"]).run();
    let checks: serde_json::Value = serde_json::from_str(&doctor.stdout()).unwrap();
    let line = checks
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["detail"].as_str().unwrap().starts_with("cgroup v2 delegation"))
        .unwrap()
        .clone();
    let detail = line["detail"].as_str().unwrap().to_string();
    let delegated = detail
        .strip_prefix("cgroup v2 delegation: delegated: ")
        .map(|d| PathBuf::from(d.split([',', ';']).next().unwrap()));
    let limited = line["level"] == "ok";
    assert_eq!(limited, delegated.is_some() && detail.contains("pids.max and memory.max"));
    // The limits branch below never runs on the CI machines (their cgroup2 offers only
    // `hugetlb`, or nothing is delegated to the unprivileged user); it is a manual check
    // (docs/testing.md). If a CI machine ever offers delegated limits, this fails so that the
    // doc and this line are updated rather than the branch silently starting (or not) to run.
    assert!(
        !support::in_ci() || !limited,
        "this CI machine offers delegated cgroup limits ({detail}): the limits branch now runs \
         in CI; update docs/testing.md's manual check and remove this assertion"
    );

    // A session that waits on stdin, so the host side can look at it while it runs.
    let mut cmd = sb
        .exec(&["sh", "-c", "tail -n1 /proc/self/cgroup; read x; echo done"])
        .hook("AIRLOCK_TEST_PIDS_MAX", "20")
        .cmd;
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut inside = String::new();
    out.read_line(&mut inside).unwrap();
    // The sandbox's cgroup namespace is rooted at its own cgroup (or, without a leaf, at the
    // supervisor's): it sees itself at the root either way.
    assert_eq!(inside, "0::/\n");
    let supervisor = child.id();
    let init: u32 =
        std::fs::read_to_string(format!("/proc/{supervisor}/task/{supervisor}/children"))
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
    let init_cgroup = cgroup_v2_of(init);
    let leaf = match &delegated {
        Some(dir) => {
            let name = Path::new(&init_cgroup).file_name().unwrap().to_str().unwrap().to_string();
            assert!(name.starts_with("airlock-") && name != "airlock-supervisor", "{init_cgroup}");
            let leaf = dir.join(&name);
            let procs = std::fs::read_to_string(leaf.join("cgroup.procs")).unwrap();
            assert!(procs.lines().any(|p| p == init.to_string()), "{procs}");
            if limited {
                let pids_max = std::fs::read_to_string(leaf.join("pids.max")).unwrap();
                assert_eq!(pids_max.trim(), "20");
                assert!(leaf.join("memory.max").exists());
            }
            Some(leaf)
        }
        None => {
            // No leaf: init stays in the supervisor's cgroup.
            assert_eq!(init_cgroup, cgroup_v2_of(supervisor));
            None
        }
    };
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert_eq!(rest, "done\n");
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(0), "{stderr}");
    if let Some(leaf) = &leaf {
        assert!(!leaf.exists(), "{} left behind after the session", leaf.display());
    }
    if limited {
        // Applied without complaint, and pids.max holds: forks past 20 fail with EAGAIN.
        assert!(!stderr.contains("cgroup"), "{stderr}");
        let code = "import errno, os, time\n\
            kids = []\n\
            try:\n\
            \x20   for _ in range(50):\n\
            \x20       pid = os.fork()\n\
            \x20       if pid == 0:\n\
            \x20           time.sleep(5); os._exit(0)\n\
            \x20       kids.append(pid)\n\
            \x20   print('forked all', len(kids))\n\
            except OSError as e:\n\
            \x20   print('EAGAIN' if e.errno == errno.EAGAIN else e, len(kids))\n\
            for k in kids:\n\
            \x20   os.kill(k, 9)\n";
        let run = sb.exec(&["python3", "-c", code]).hook("AIRLOCK_TEST_PIDS_MAX", "20").run();
        let out = run.stdout();
        assert!(out.starts_with("EAGAIN "), "{out}{}", run.stderr());
        let forked: usize = out.trim().rsplit(' ').next().unwrap().parse().unwrap();
        assert!(forked < 20, "{out}");
    } else {
        // The optional layer is missing: said once, with the reason, and the session ran.
        let expected = match &delegated {
            None => "no delegated cgroup v2 subtree",
            Some(_) if detail.contains("holds other processes") => "holds other processes",
            Some(_) => "does not offer the",
        };
        assert!(stderr.contains(expected), "{stderr}");
    }
}
