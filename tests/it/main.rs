//! Airlock's integration suite: one binary driving the real `airlock` and `airlockd`.
//! Run with `cargo test --features test-hooks` (the README's test command).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[cfg(not(feature = "test-hooks"))]
compile_error!(
    "the integration suite needs test-only hooks: run `cargo test --features test-hooks`"
);

mod review;
mod review_store;
mod review_support;
mod support;
