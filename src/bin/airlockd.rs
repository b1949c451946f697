//! The `airlockd` binary: a thin shell over [`airlock::daemon::main`] (service, standalone
//! proxy, review plane), whose return value is the process exit status (64: no activation socket
//! or a bad `AIRLOCK_LOG`). The one log subscriber is installed first ([`airlock::logging`]).

fn main() {
    // Before anything can log; no thread exists yet, as socket adoption requires.
    if let Err(err) =
        airlock::logging::init(&airlock::env::ProcessEnv, airlock::logging::Program::Daemon)
    {
        eprintln!("airlockd: {err}");
        // sysexits(3) EX_USAGE, which the unit's RestartPreventExitStatus keeps from looping.
        std::process::exit(airlock::daemon::EXIT_NO_SOCKET);
    }
    std::process::exit(airlock::daemon::main());
}
