//! The Linux-native sandbox behind `airlock exec`/`run` (SECURITY §4, DESIGN §7; walkthrough in
//! `docs/sandbox.md`).
//!
//! - [`supervisor`]: the host side of one session (`supervisor::run`): plan, fork into the
//!   namespaces, receive the listener, hand it to a [`bridge::ProxyBridge`], relay, sweep.
//! - [`inside`]: setup inside the namespaces and the PID-1 init.
//! - [`mounts`]: the filesystem plan (pure data) and its execution.
//! - What a session leaves behind (SECURITY §7): [`gitptr`] judges git pointers against
//!   `airlock policy trust`'s record; [`protect`] lists, pins and placeholders the paths the host
//!   runs later; [`sweep`] judges everything that changed at the end; [`quarantine`] stores
//!   what it takes and gives it back; [`gitconfig`] gives git a private writable copy of each
//!   protected `config` and merges it back through an allowlist.
//! - [`seccomp`], [`landlock`]: the filters; [`probe`]: what the kernel offers (also
//!   `airlock doctor`'s kernel lines via [`probe::report`]).
//! - [`codekeys`]: which keys of host-read config files can run code; splits an agent's edit
//!   into kept and held parts (pure: bytes in, bytes out).
//! - [`ports`]: `--port`, a server inside reached from the host (listeners, init's side of
//!   the channel, the relay).
//! - [`cgroup`]: the per-session cgroup v2 leaf and its limits.
//! - [`usermount`]: mounts a person chose (`[sandbox] mounts`, `--mount`) and every reason one
//!   is refused; [`toolchain`]: what mounted toolchains and per-repo caches set inside.
//! - [`env`]: the environment inside; [`relay`]: stdio between the caller and the sandbox;
//!   [`termfilter`]: the escape sequences the relay keeps from the caller's terminal.
//!
//! Every `unsafe` block lives in `crate::sys` (`namespaces`, `exec`).

pub mod bridge;
pub mod cgroup;
pub mod codekeys;
pub mod env;
pub mod gitconfig;
pub mod gitindex;
pub mod gitptr;
pub mod inside;
pub mod landlock;
pub mod mounts;
pub mod ports;
pub mod probe;
pub mod protect;
pub mod quarantine;
pub mod relay;
pub mod seccomp;
pub mod supervisor;
pub mod sweep;
pub mod termfilter;
pub mod toolchain;
pub mod usermount;
