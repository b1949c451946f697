//! The `airlockd` binary: a thin shell over [`airlock::daemon::main`] (service, standalone
//! proxy, review plane), whose return value is the process exit status (64: no activation socket).

fn main() {
    std::process::exit(airlock::daemon::main());
}
