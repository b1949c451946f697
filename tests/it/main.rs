//! Airlock's integration suite: one binary driving the real `airlock` and `airlockd`.
//! Run with `cargo test --features test-hooks` (the README's test command). Built without
//! `test-hooks` (the binaries users install) it holds only the tests that need no test hook:
//! modules and tests using one (the `hold` bridge, the test resolver, the managed-policy,
//! probe, limit or protocol overrides) are `#[cfg(feature = "test-hooks")]` (docs/testing.md).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[cfg(feature = "test-hooks")]
mod audit_root;
#[cfg(feature = "test-hooks")]
mod audit_volume;
mod browser;
#[cfg(feature = "test-hooks")]
mod capture;
mod cli_identity;
mod cli_policy;
mod cli_policy_edit;
mod cli_policy_init;
mod cli_policy_learn;
mod cli_policy_tests;
mod console_auth;
mod console_browser;
mod console_gates;
mod console_pages;
#[cfg(feature = "test-hooks")]
mod container_backend;
#[cfg(feature = "test-hooks")]
mod correlate_e2e;
#[cfg(feature = "test-hooks")]
mod correlate_fixtures;
#[cfg(feature = "test-hooks")]
mod correlate_lab;
mod correlate_replay;
mod correlate_score;
mod daemon;
mod daemon_units;
mod evidence_client;
mod harness;
mod logging;
mod logs;
#[cfg(feature = "test-hooks")]
mod proxy;
#[cfg(feature = "test-hooks")]
mod proxy_adversarial;
#[cfg(feature = "test-hooks")]
mod proxy_host_addrs;
#[cfg(feature = "test-hooks")]
mod proxy_malformed;
#[cfg(feature = "test-hooks")]
mod proxy_support;
mod publish;
mod publish_robust;
mod remote_login;
mod review;
#[cfg(feature = "test-hooks")]
mod review_atomic;
mod review_bounded;
mod review_conflict;
mod review_contract;
mod review_correlate;
mod review_detect;
mod review_export;
mod review_flag_assign;
mod review_flags;
mod review_gates;
mod review_init;
mod review_limits;
mod review_log;
mod review_metrics;
mod review_pg_privilege;
mod review_pg_tls;
mod review_pg_two_instances;
mod review_scope;
mod review_store;
mod review_support;
mod review_transcripts;
mod review_validate;
mod sandbox;
mod sandbox_agent;
mod sandbox_agent_login;
mod sandbox_control;
#[cfg(feature = "test-hooks")]
mod sandbox_dns;
#[cfg(feature = "test-hooks")]
mod sandbox_gate;
#[cfg(feature = "test-hooks")]
mod sandbox_gate_server;
#[cfg(feature = "test-hooks")]
mod sandbox_gitconfig;
#[cfg(feature = "test-hooks")]
mod sandbox_layer_digests;
mod sandbox_leave_behind;
#[cfg(feature = "test-hooks")]
mod sandbox_limits;
mod sandbox_logdir;
#[cfg(feature = "test-hooks")]
mod sandbox_phase;
mod sandbox_ports;
#[cfg(feature = "test-hooks")]
mod sandbox_proxy;
mod sandbox_publish_plant;
#[cfg(feature = "test-hooks")]
mod sandbox_refusals;
#[cfg(feature = "test-hooks")]
mod sandbox_setid;
#[cfg(feature = "test-hooks")]
mod sandbox_ssh;
#[cfg(feature = "test-hooks")]
mod sandbox_terminal;
mod sandbox_token_hidden;
#[cfg(feature = "test-hooks")]
mod sandbox_toolchains;
mod service_install;
mod sshd;
mod status_no_start;
mod support;
