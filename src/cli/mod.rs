//! The `airlock` command line: argument parsing and dispatch (clap derive).

/// Entry point of the `airlock` binary; returns the process exit code.
pub fn main() -> i32 {
    0
}
