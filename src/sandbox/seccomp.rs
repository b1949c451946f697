//! The sandbox's seccomp filter, exactly as SECURITY §4 lists it, built with `seccompiler` plus
//! a short hand-written prologue for what seccompiler's per-syscall maps cannot express: the
//! architecture check that also denies the x32 ABI, "any number above the highest one we know →
//! ENOSYS" (so a newer kernel cannot widen the filter), and `clone3` and `openat2` → ENOSYS (so
//! libc falls back to `clone`/`openat`, whose arguments the filter can inspect). See seccomp(2).
//!
//! Beyond SECURITY §4's list, no call may set S_ISUID or S_ISGID (SECURITY §7: no setuid/setgid
//! bit survives): a root caller's agent could otherwise `chmod 4755` a copy of a binary in the
//! repo, which any local user could then run as uid 0 on the host.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition,
    SeccompFilter, SeccompRule, TargetArch, sock_filter,
};

/// Errors building the filter (only possible through a programming error in the rule table).
#[derive(Debug, thiserror::Error)]
#[error("building the seccomp filter: {0}")]
pub struct SeccompBuildError(String);

#[cfg(target_arch = "x86_64")]
mod arch {
    pub const AUDIT_ARCH: u32 = 0xC000_003E; // AUDIT_ARCH_X86_64
    pub const TARGET: &str = "x86_64";
    /// x32 system calls carry this bit in their number (arch/x86/include/uapi/asm/unistd.h).
    pub const X32_SYSCALL_BIT: Option<u32> = Some(0x4000_0000);
}
#[cfg(target_arch = "aarch64")]
mod arch {
    pub const AUDIT_ARCH: u32 = 0xC000_00B7; // AUDIT_ARCH_AARCH64
    pub const TARGET: &str = "aarch64";
    pub const X32_SYSCALL_BIT: Option<u32> = None;
}

/// The highest system call number this filter was reviewed against (`file_setattr`, Linux
/// 6.17, on both x86_64 and aarch64's generic table). Anything above → ENOSYS.
pub const HIGHEST_KNOWN_SYSCALL: u32 = 469;
/// `open_tree_attr` (Linux 6.15), not yet in the libc crate.
pub const SYS_OPEN_TREE_ATTR: i64 = 467;

const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;

/// Every `CLONE_NEW*` flag valid for clone(2) (CLONE_NEWTIME lives in clone's exit-signal
/// byte and is only meaningful to unshare/clone3).
pub const CLONE_NEW_FLAGS: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET) as u64;
const CLONE_NEWTIME: u64 = 0x80;
/// The obsolete `SOCK_PACKET` type (packet(7)); a packet socket under an AF_INET family.
const SOCK_PACKET: i32 = 10;
/// inode(7): the set-user-ID and set-group-ID mode bits.
const S_ISUID: u64 = 0o4000;
const S_ISGID: u64 = 0o2000;
/// `fchmodat2` (Linux 6.6; 452 in both x86_64's and the generic table), not in the libc crate
/// for every target.
pub const SYS_FCHMODAT2: i64 = 452;

/// System calls denied outright with EPERM (SECURITY §4).
pub fn denied_syscalls() -> Vec<(i64, &'static str)> {
    let mut list = vec![
        (libc::SYS_io_uring_setup, "io_uring_setup"),
        (libc::SYS_io_uring_enter, "io_uring_enter"),
        (libc::SYS_io_uring_register, "io_uring_register"),
        (libc::SYS_ptrace, "ptrace"),
        (libc::SYS_process_vm_readv, "process_vm_readv"),
        (libc::SYS_process_vm_writev, "process_vm_writev"),
        (libc::SYS_pidfd_getfd, "pidfd_getfd"),
        (libc::SYS_setns, "setns"),
        (libc::SYS_mount, "mount"),
        (libc::SYS_umount2, "umount2"),
        (libc::SYS_pivot_root, "pivot_root"),
        (libc::SYS_fsopen, "fsopen"),
        (libc::SYS_fsconfig, "fsconfig"),
        (libc::SYS_fsmount, "fsmount"),
        (libc::SYS_move_mount, "move_mount"),
        (libc::SYS_open_tree, "open_tree"),
        (SYS_OPEN_TREE_ATTR, "open_tree_attr"),
        (libc::SYS_mount_setattr, "mount_setattr"),
        (libc::SYS_bpf, "bpf"),
        (libc::SYS_keyctl, "keyctl"),
        (libc::SYS_add_key, "add_key"),
        (libc::SYS_request_key, "request_key"),
        (libc::SYS_perf_event_open, "perf_event_open"),
        (libc::SYS_userfaultfd, "userfaultfd"),
        (libc::SYS_kexec_load, "kexec_load"),
        (libc::SYS_kexec_file_load, "kexec_file_load"),
        (libc::SYS_init_module, "init_module"),
        (libc::SYS_finit_module, "finit_module"),
        (libc::SYS_delete_module, "delete_module"),
        (libc::SYS_reboot, "reboot"),
        (libc::SYS_swapon, "swapon"),
        (libc::SYS_swapoff, "swapoff"),
        (libc::SYS_acct, "acct"),
    ];
    list.sort_unstable();
    list
}

/// System calls that take a file mode, with the index of the mode argument: chmod(2),
/// open(2), mkdir(2), mknod(2). aarch64 has only the `*at` forms (and `fchmod`). Linux's mkdir
/// ignores S_ISUID/S_ISGID in its mode today (a directory's setgid comes from its parent); it is
/// listed anyway so the rule does not rest on that.
pub fn mode_syscalls() -> Vec<(i64, u8, &'static str)> {
    #[allow(unused_mut)]
    let mut list = vec![
        (libc::SYS_fchmod, 1, "fchmod"),
        (libc::SYS_fchmodat, 2, "fchmodat"),
        (SYS_FCHMODAT2, 2, "fchmodat2"),
        (libc::SYS_openat, 3, "openat"),
        (libc::SYS_mkdirat, 2, "mkdirat"),
        (libc::SYS_mknodat, 2, "mknodat"),
    ];
    #[cfg(target_arch = "x86_64")]
    list.extend([
        (libc::SYS_chmod, 1, "chmod"),
        (libc::SYS_open, 2, "open"),
        (libc::SYS_creat, 1, "creat"),
        (libc::SYS_mkdir, 1, "mkdir"),
        (libc::SYS_mknod, 1, "mknod"),
    ]);
    list.sort_unstable();
    list
}

fn cond(arg: u8, len: Len, op: Op, value: u64) -> Result<SeccompCondition, SeccompBuildError> {
    SeccompCondition::new(arg, len, op, value).map_err(|e| SeccompBuildError(e.to_string()))
}

fn rule(conds: Vec<SeccompCondition>) -> Result<SeccompRule, SeccompBuildError> {
    SeccompRule::new(conds).map_err(|e| SeccompBuildError(e.to_string()))
}

/// One rule per `CLONE_NEW*` bit: the call matches if any of them is set in `arg`.
fn any_flag_rules(flags: u64, len: Len) -> Result<Vec<SeccompRule>, SeccompBuildError> {
    (0..64)
        .map(|bit| 1u64 << bit)
        .filter(|bit| flags & bit != 0)
        .map(|bit| {
            let len = if matches!(len, Len::Qword) { Len::Qword } else { Len::Dword };
            rule(vec![cond(0, len, Op::MaskedEq(bit), bit)?])
        })
        .collect()
}

fn socket_rules() -> Result<Vec<SeccompRule>, SeccompBuildError> {
    let mut rules = Vec::new();
    for family in [libc::AF_VSOCK, libc::AF_PACKET, libc::AF_NETLINK] {
        rules.push(rule(vec![cond(0, Len::Dword, Op::Eq, family as u64)?])?);
    }
    // The socket type may carry SOCK_NONBLOCK/SOCK_CLOEXEC; the type itself is the low nibble.
    for family in [libc::AF_INET, libc::AF_INET6] {
        for ty in [libc::SOCK_RAW, SOCK_PACKET] {
            rules.push(rule(vec![
                cond(0, Len::Dword, Op::Eq, family as u64)?,
                cond(1, Len::Dword, Op::MaskedEq(0xf), ty as u64)?,
            ])?);
        }
    }
    Ok(rules)
}

/// Matches when the mode argument `arg` carries S_ISUID or S_ISGID. mode_t is an unsigned int
/// and the kernel truncates the register to it, so only the low 32 bits are compared: high bits
/// can neither hide a set bit nor fake one.
fn setid_mode_rules(arg: u8) -> Result<Vec<SeccompRule>, SeccompBuildError> {
    [S_ISUID, S_ISGID]
        .into_iter()
        .map(|bit| rule(vec![cond(arg, Len::Dword, Op::MaskedEq(bit), bit)?]))
        .collect()
}

fn ioctl_rules() -> Result<Vec<SeccompRule>, SeccompBuildError> {
    // The kernel truncates the request to unsigned int, so a 32-bit compare cannot be evaded
    // by setting high bits.
    [libc::TIOCSTI, libc::TIOCLINUX]
        .into_iter()
        .map(|req| rule(vec![cond(1, Len::Dword, Op::Eq, req)?]))
        .collect()
}

/// The seccompiler part: every rule here → EPERM, everything else allowed.
fn eperm_filter() -> Result<BpfProgram, SeccompBuildError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for (nr, _) in denied_syscalls() {
        rules.insert(nr, Vec::new());
    }
    rules.insert(libc::SYS_clone, any_flag_rules(CLONE_NEW_FLAGS, Len::Qword)?);
    rules.insert(libc::SYS_unshare, any_flag_rules(CLONE_NEW_FLAGS | CLONE_NEWTIME, Len::Dword)?);
    rules.insert(libc::SYS_socket, socket_rules()?);
    rules.insert(libc::SYS_ioctl, ioctl_rules()?);
    for (nr, arg, _) in mode_syscalls() {
        rules.insert(nr, setid_mode_rules(arg)?);
    }
    let arch = TargetArch::try_from(arch::TARGET).map_err(|e| SeccompBuildError(e.to_string()))?;
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(|e| SeccompBuildError(e.to_string()))?;
    BpfProgram::try_from(filter).map_err(|e| SeccompBuildError(e.to_string()))
}

const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JEQ_K: u16 = 0x15;
const BPF_JGT_K: u16 = 0x25;
const BPF_JGE_K: u16 = 0x35;
const BPF_RET_K: u16 = 0x06;
const OFFSET_NR: u32 = 0;
const OFFSET_ARCH: u32 = 4;

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter { code, jt: 0, jf: 0, k }
}
fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// Arch check, x32 denial, unknown numbers, clone3 and openat2; falls through to the rule table.
fn prologue() -> Vec<sock_filter> {
    let mut p = vec![
        stmt(BPF_LD_W_ABS, OFFSET_ARCH),
        jump(BPF_JEQ_K, arch::AUDIT_ARCH, 1, 0),
        stmt(BPF_RET_K, SECCOMP_RET_KILL_PROCESS),
        stmt(BPF_LD_W_ABS, OFFSET_NR),
    ];
    if let Some(bit) = arch::X32_SYSCALL_BIT {
        p.push(jump(BPF_JGE_K, bit, 0, 1));
        p.push(stmt(BPF_RET_K, SECCOMP_RET_ERRNO | libc::EPERM as u32));
    }
    p.extend([
        jump(BPF_JGT_K, HIGHEST_KNOWN_SYSCALL, 0, 1),
        stmt(BPF_RET_K, SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
        jump(BPF_JEQ_K, libc::SYS_clone3 as u32, 0, 1),
        stmt(BPF_RET_K, SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
        // openat2(2) passes its mode inside `struct open_how`, behind a pointer seccomp cannot
        // read (seccomp(2)), so the setid rule could not see it. ENOSYS makes libc and
        // runtimes fall back to openat, which the rule table checks.
        jump(BPF_JEQ_K, libc::SYS_openat2 as u32, 0, 1),
        stmt(BPF_RET_K, SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
    ]);
    p
}

/// The complete program installed in the sandbox.
pub fn build() -> Result<BpfProgram, SeccompBuildError> {
    let mut program = prologue();
    program.extend(eperm_filter()?);
    if program.len() > u16::MAX as usize {
        return Err(SeccompBuildError("program too long".into()));
    }
    Ok(program)
}

/// Installs the filter on the calling thread (sets `no_new_privs` first, as seccomp(2)
/// requires without CAP_SYS_ADMIN).
pub fn install(program: &BpfProgram) -> Result<(), SeccompBuildError> {
    seccompiler::apply_filter(program).map_err(|e| SeccompBuildError(e.to_string()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// A classic-BPF interpreter for the instructions seccompiler and the prologue emit, run
    /// over a `struct seccomp_data` so the filter's decisions are tested without installing it.
    fn run(prog: &[sock_filter], arch: u32, nr: u32, args: [u64; 6]) -> u32 {
        let word = |off: u32| -> u32 {
            match off {
                0 => nr,
                4 => arch,
                8 | 12 => 0,
                o if (16..64).contains(&o) => {
                    let i = ((o - 16) / 8) as usize;
                    if (o - 16) % 8 == 0 { args[i] as u32 } else { (args[i] >> 32) as u32 }
                }
                o => panic!("load at offset {o}"),
            }
        };
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let ins = &prog[pc];
            pc += 1;
            match ins.code {
                0x20 => acc = word(ins.k),
                0x54 => acc &= ins.k,
                0x05 => pc += ins.k as usize,
                0x15 | 0x25 | 0x35 | 0x45 => {
                    let taken = match ins.code {
                        0x15 => acc == ins.k,
                        0x25 => acc > ins.k,
                        0x35 => acc >= ins.k,
                        _ => acc & ins.k != 0,
                    };
                    pc += if taken { ins.jt } else { ins.jf } as usize;
                }
                0x06 => return ins.k,
                code => panic!("unexpected BPF opcode {code:#x}"),
            }
        }
    }

    const ALLOW: u32 = 0x7fff_0000;
    fn errno(e: i32) -> u32 {
        SECCOMP_RET_ERRNO | e as u32
    }
    fn call(nr: i64, args: [u64; 6]) -> u32 {
        run(&build().unwrap(), arch::AUDIT_ARCH, nr as u32, args)
    }

    #[test]
    fn foreign_architectures_are_killed() {
        let prog = build().unwrap();
        assert_eq!(run(&prog, 0x4000_0003, 1, [0; 6]), SECCOMP_RET_KILL_PROCESS); // i386
        assert_eq!(run(&prog, 0x4000_0028, 1, [0; 6]), SECCOMP_RET_KILL_PROCESS); // arm
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn x32_calls_are_denied() {
        assert_eq!(call(0x4000_0000 + libc::SYS_getpid, [0; 6]), errno(libc::EPERM));
    }

    #[test]
    fn unknown_numbers_and_clone3_are_enosys() {
        assert_eq!(call(HIGHEST_KNOWN_SYSCALL as i64 + 1, [0; 6]), errno(libc::ENOSYS));
        assert_eq!(call(1000, [0; 6]), errno(libc::ENOSYS));
        assert_eq!(call(libc::SYS_clone3, [0; 6]), errno(libc::ENOSYS));
        assert_eq!(call(HIGHEST_KNOWN_SYSCALL as i64, [0; 6]), ALLOW);
    }

    /// x86_64 numbers written by hand from arch/x86/entry/syscalls/syscall_64.tbl (not from
    /// libc and not from the implementation's lists), so a wrong or missing constant there
    /// shows up here.
    #[cfg(target_arch = "x86_64")]
    mod x86_64_table {
        /// SECURITY §4's EPERM list.
        pub const DENIED: [(u32, &str); 33] = [
            (425, "io_uring_setup"),
            (426, "io_uring_enter"),
            (427, "io_uring_register"),
            (101, "ptrace"),
            (310, "process_vm_readv"),
            (311, "process_vm_writev"),
            (438, "pidfd_getfd"),
            (308, "setns"),
            (165, "mount"),
            (166, "umount2"),
            (155, "pivot_root"),
            (430, "fsopen"),
            (431, "fsconfig"),
            (432, "fsmount"),
            (429, "move_mount"),
            (428, "open_tree"),
            (467, "open_tree_attr"),
            (442, "mount_setattr"),
            (321, "bpf"),
            (250, "keyctl"),
            (248, "add_key"),
            (249, "request_key"),
            (298, "perf_event_open"),
            (323, "userfaultfd"),
            (246, "kexec_load"),
            (320, "kexec_file_load"),
            (175, "init_module"),
            (313, "finit_module"),
            (176, "delete_module"),
            (169, "reboot"),
            (167, "swapon"),
            (168, "swapoff"),
            (163, "acct"),
        ];
        /// Calls that take a mode, and the mode's argument index (chmod(2), open(2),
        /// mkdir(2), mknod(2)).
        pub const MODE_CALLS: [(u32, &str, usize); 11] = [
            (90, "chmod", 1),
            (91, "fchmod", 1),
            (268, "fchmodat", 2),
            (452, "fchmodat2", 2),
            (2, "open", 2),
            (257, "openat", 3),
            (85, "creat", 1),
            (83, "mkdir", 1),
            (258, "mkdirat", 2),
            (133, "mknod", 1),
            (259, "mknodat", 2),
        ];
        pub const OPENAT2: u32 = 437;
        pub const CLONE3: u32 = 435;
        /// Ordinary calls that must stay allowed: read, write, open, openat, execve.
        pub const ORDINARY: [u32; 5] = [0, 1, 2, 257, 59];
        /// O_WRONLY | O_CREAT (asm-generic/fcntl.h).
        pub const O_WRONLY_CREAT: u64 = 0o1 | 0o100;
    }

    #[cfg(target_arch = "x86_64")]
    fn call_nr(nr: u32, args: [u64; 6]) -> u32 {
        run(&build().unwrap(), arch::AUDIT_ARCH, nr, args)
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn listed_syscalls_are_eperm_and_ordinary_ones_allowed() {
        for (nr, name) in x86_64_table::DENIED {
            assert_eq!(call_nr(nr, [0; 6]), errno(libc::EPERM), "{name} ({nr})");
        }
        for nr in x86_64_table::ORDINARY {
            assert_eq!(call_nr(nr, [0; 6]), ALLOW, "{nr}");
        }
        assert_eq!(call_nr(x86_64_table::CLONE3, [0; 6]), errno(libc::ENOSYS));
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn setuid_and_setgid_modes_are_eperm_on_every_mode_call() {
        use x86_64_table::{MODE_CALLS, O_WRONLY_CREAT, OPENAT2};
        let with_mode = |name: &str, arg: usize, mode: u64| {
            let mut args = [0u64; 6];
            args[arg] = mode;
            // open/openat: a creating open, where the kernel honours the mode (open(2)).
            match name {
                "open" => args[1] = O_WRONLY_CREAT,
                "openat" => args[2] = O_WRONLY_CREAT,
                _ => {}
            }
            args
        };
        for (nr, name, arg) in MODE_CALLS {
            for mode in [
                0o4755,
                0o2755,
                0o6755,
                0o4000,
                0o2000,
                0o100_000 | 0o4644,             // S_IFREG | setuid (mknod)
                0o010_000 | 0o2644,             // S_IFIFO | setgid
                0xffff_ffff_0000_0000 | 0o4755, // high bits cannot hide it (truncated)
            ] {
                let got = call_nr(nr, with_mode(name, arg, mode));
                assert_eq!(got, errno(libc::EPERM), "{name} mode {mode:#o}");
            }
            for mode in [0o755, 0o644, 0o777, 0o1777, 0, 0o100_644, 0o4755 << 32] {
                let got = call_nr(nr, with_mode(name, arg, mode));
                assert_eq!(got, ALLOW, "{name} mode {mode:#o}");
            }
            // A setid bit in another argument is not the mode.
            for other in (0..6).filter(|a| *a != arg) {
                let mut args = with_mode(name, arg, 0o644);
                args[other] = 0o6000;
                assert_eq!(call_nr(nr, args), ALLOW, "{name} arg{other}");
            }
        }
        assert_eq!(call_nr(OPENAT2, [0; 6]), errno(libc::ENOSYS));
    }

    #[test]
    fn the_implementations_lists_are_denied_on_this_arch() {
        for (nr, name) in denied_syscalls() {
            assert_eq!(call(nr, [0; 6]), errno(libc::EPERM), "{name}");
        }
        for (nr, arg, name) in mode_syscalls() {
            let mut args = [0u64; 6];
            args[arg as usize] = 0o4755;
            assert_eq!(call(nr, args), errno(libc::EPERM), "{name}");
            args[arg as usize] = 0o755;
            assert_eq!(call(nr, args), ALLOW, "{name}");
        }
        assert_eq!(call(libc::SYS_openat2, [0; 6]), errno(libc::ENOSYS));
    }

    #[test]
    fn clone_and_unshare_with_new_namespaces_are_eperm() {
        let fork_flags = (libc::CLONE_CHILD_SETTID | libc::CLONE_CHILD_CLEARTID) as u64 | 17;
        assert_eq!(call(libc::SYS_clone, [fork_flags, 0, 0, 0, 0, 0]), ALLOW);
        let thread = (libc::CLONE_VM | libc::CLONE_THREAD | libc::CLONE_SIGHAND) as u64;
        assert_eq!(call(libc::SYS_clone, [thread, 0, 0, 0, 0, 0]), ALLOW);
        for bit in 0..64 {
            let flag = 1u64 << bit;
            if CLONE_NEW_FLAGS & flag != 0 {
                assert_eq!(call(libc::SYS_clone, [flag | 17, 0, 0, 0, 0, 0]), errno(libc::EPERM));
                assert_eq!(call(libc::SYS_unshare, [flag, 0, 0, 0, 0, 0]), errno(libc::EPERM));
            }
        }
        assert_eq!(call(libc::SYS_unshare, [CLONE_NEWTIME, 0, 0, 0, 0, 0]), errno(libc::EPERM));
        assert_eq!(call(libc::SYS_unshare, [libc::CLONE_FILES as u64, 0, 0, 0, 0, 0]), ALLOW);
    }

    #[test]
    fn socket_families_and_raw_sockets() {
        let s = |d: i32, t: i32| call(libc::SYS_socket, [d as u64, t as u64, 0, 0, 0, 0]);
        assert_eq!(s(libc::AF_INET, libc::SOCK_STREAM), ALLOW);
        assert_eq!(s(libc::AF_INET6, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC), ALLOW);
        assert_eq!(s(libc::AF_UNIX, libc::SOCK_STREAM), ALLOW);
        assert_eq!(s(libc::AF_INET, libc::SOCK_RAW), errno(libc::EPERM));
        assert_eq!(s(libc::AF_INET6, libc::SOCK_RAW | libc::SOCK_NONBLOCK), errno(libc::EPERM));
        assert_eq!(s(libc::AF_INET, SOCK_PACKET), errno(libc::EPERM));
        assert_eq!(s(libc::AF_PACKET, libc::SOCK_DGRAM), errno(libc::EPERM));
        assert_eq!(s(libc::AF_NETLINK, libc::SOCK_RAW), errno(libc::EPERM));
        assert_eq!(s(libc::AF_VSOCK, libc::SOCK_STREAM), errno(libc::EPERM));
    }

    #[test]
    fn tiocsti_and_tioclinux_are_eperm_even_with_high_bits() {
        let io = |req: u64| call(libc::SYS_ioctl, [0, req, 0, 0, 0, 0]);
        assert_eq!(io(libc::TIOCSTI), errno(libc::EPERM));
        assert_eq!(io(libc::TIOCSTI | 0xffff_ffff_0000_0000), errno(libc::EPERM));
        assert_eq!(io(libc::TIOCLINUX), errno(libc::EPERM));
        assert_eq!(io(libc::TIOCGWINSZ), ALLOW);
        assert_eq!(io(libc::FIONREAD), ALLOW);
    }
}
