//! `airlockd bridge-guard`: installs (or, with `--check`, looks for) the Docker backend's
//! host-side drop rule for each named bridge ([`crate::sys::bridge_guard`]). The container
//! backend runs it in a short-lived helper container on the engine host's network
//! (`--network host --cap-add NET_ADMIN`); docs/backends.md.

/// `airlockd bridge-guard` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct BridgeGuardArgs {
    /// A repo network's bridge device (repeatable), e.g. `alk-0123abcd`.
    #[arg(long = "bridge", value_name = "DEVICE", required = true, value_parser = parse_bridge)]
    pub bridges: Vec<String>,
    /// Only report, one line per bridge (`BRIDGE in-force` or `BRIDGE missing`); exit 1 when
    /// any is missing.
    #[arg(long)]
    pub check: bool,
}

fn parse_bridge(s: &str) -> Result<String, String> {
    crate::sys::bridge_guard::check_name(s).map_err(|e| e.to_string())?;
    Ok(s.to_owned())
}

/// Exit codes: 0 every rule in place, 1 (`--check`) one missing, 2 the kernel refused.
pub fn main(args: &BridgeGuardArgs) -> i32 {
    use crate::sys::bridge_guard;
    let mut missing = false;
    for bridge in &args.bridges {
        let table = bridge_guard::table(bridge);
        if args.check {
            match bridge_guard::present(bridge) {
                Ok(true) => println!("{bridge} in-force"),
                Ok(false) => {
                    println!("{bridge} missing");
                    missing = true;
                }
                Err(e) => {
                    eprintln!("airlockd bridge-guard: {bridge}: {e}");
                    return 2;
                }
            }
        } else if let Err(e) = bridge_guard::install(bridge) {
            eprintln!("airlockd bridge-guard: {bridge}: {e}");
            return 2;
        } else {
            println!("{bridge} in-force (table inet {table}: input from it is dropped)");
        }
    }
    i32::from(missing)
}
