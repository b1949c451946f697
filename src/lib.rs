//! Airlock: run coding agents in a sandbox whose only way out is an audited egress proxy.
//!
//! One room per concern (see `docs/architecture.md`):
//!
//! ```text
//! cli/ ─► config/ (layers, trust, identity) ─► client ─► [unix socket] ─► daemon/
//!   │                                                                       │
//!   └─► sandbox/ ── listener fd ────────────────────────────────────────────┘
//!                                                                           ▼
//!        policy/ (canonicalize, match, verdict; pure) ◄── proxy/ (CONNECT, HTTP, resolver, guard)
//!                                                                           ▼
//!                                                  audit/ (journal, JSONL writer, reader)
//! review/ (ingest, store, detect)          remote/ (the host-side review-plane client)
//! gate/ (held actions awaiting a person's decision; the daemon's book, the proxy holds)
//! ```
//!
//! `unsafe` lives only in [`sys`]; the compiler enforces it (`unsafe_code` is denied elsewhere).

#![deny(unsafe_code)]

pub mod agent;
pub mod audit;
pub mod cli;
pub mod client;
pub mod config;
pub mod container;
pub mod daemon;
pub mod env;
pub mod evidence;
pub mod fsat;
pub mod gate;
pub mod hostpath;
pub mod logging;
pub mod paths;
pub mod policy;
pub mod protocol;
pub mod proxy;
pub mod publish;
pub mod remote;
pub mod repo;
pub mod review;
pub mod sandbox;
#[allow(unsafe_code)]
pub mod sys;
pub mod timefmt;
pub mod tlog;
