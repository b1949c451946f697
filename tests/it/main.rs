//! Airlock's integration suite: one binary driving the real `airlock` and `airlockd`.
//! Run with `cargo test --features test-hooks` (the README's test command).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cli_identity;
mod cli_policy;
mod daemon;
mod daemon_units;
mod harness;
mod logging;
mod logs;
mod proxy;
mod proxy_adversarial;
mod proxy_support;
mod review;
mod review_store;
mod review_support;
mod sandbox;
mod sandbox_agent;
mod sandbox_control;
mod sandbox_leave_behind;
mod sandbox_proxy;
mod sandbox_setid;
mod sandbox_terminal;
mod support;
