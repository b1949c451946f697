//! Optional Landlock layer: read/execute everywhere, write only in the repo, the home, `/tmp`
//! and `/dev`; at ABI ≥ 6 also scope abstract unix sockets and signals to the sandbox. No TCP
//! rules (dev servers on loopback inside must keep working). Best effort: the kernel's ABI
//! decides what is enforced, and the caller records the result.

use std::path::PathBuf;

use landlock::{
    ABI, Access, AccessFs, CompatLevel, Compatible, Ruleset, RulesetAttr, RulesetCreatedAttr,
    RulesetStatus, Scope, path_beneath_rules,
};

/// What ended up enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enforced {
    Full,
    Partial,
    None,
}

/// Applies the ruleset to the calling process (inherited by its children).
pub fn apply(writable: &[PathBuf]) -> Result<Enforced, landlock::RulesetError> {
    let abi = ABI::V6;
    let status = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))?
        .scope(Scope::from_all(abi))?
        .create()?
        .add_rules(path_beneath_rules(["/"], AccessFs::from_read(abi)))?
        .add_rules(path_beneath_rules(writable, AccessFs::from_all(abi)))?
        .restrict_self()?;
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => Enforced::Full,
        RulesetStatus::PartiallyEnforced => Enforced::Partial,
        RulesetStatus::NotEnforced => Enforced::None,
    })
}
