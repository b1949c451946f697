//! The `airlock` CLI binary: a thin shell over [`airlock::cli::main`], whose return value is
//! the process exit status (DESIGN §3 exit codes).

fn main() {
    std::process::exit(airlock::cli::main());
}
