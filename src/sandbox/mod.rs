//! The Linux-native sandbox behind `airlock exec`/`run` (SECURITY §4, DESIGN §7).

pub mod bridge;
pub mod env;
pub mod inside;
pub mod landlock;
pub mod mounts;
pub mod probe;
pub mod protect;
pub mod relay;
pub mod seccomp;
pub mod supervisor;
