//! The only place with `unsafe`: socket activation, fd passing, fork/exec and sandbox setup.
//! Every block carries a `// SAFETY:` comment.

pub mod activation;
pub mod bridge_guard;
pub mod exec;
pub mod fdpass;
pub mod memtrim;
pub mod namespaces;
pub mod netfilter;
pub mod nflog;
pub mod peer;
pub mod rtnetlink;
pub mod signals;
pub mod spawn;
pub mod splice;
