fn main() {
    std::process::exit(airlock::daemon::main());
}
