//! The Linux-native sandbox behind `airlock exec`/`run` (SECURITY §4, DESIGN §7).

pub mod seccomp;
pub mod protect;
pub mod mounts;
pub mod env;
pub mod probe;
pub mod landlock;
pub mod bridge;
pub mod inside;
pub mod relay;
pub mod supervisor;
