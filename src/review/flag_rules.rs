//! Who may act on a flag: the one pure decision both stores' write paths call (and that the
//! PostgreSQL `SECURITY DEFINER` flag-state function mirrors), so the rule is the same
//! wherever a state is appended.
//!
//! Nobody acts on a flag raised on their own history (the flag's `user_id` is the actor):
//! reviewing oneself is no review. Two exceptions keep a small store usable: the store's sole
//! reviewer/admin (nobody else could act), and an admin who asks for it (`"override": true`).
//! Both are recorded as self-actions (`"self": true` in the state row and the API).

use super::{Role, User};

/// Why an action on a flag is refused; each message says what to do instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("only reviewers and admins act on flags")]
    NotReviewer,
    #[error(
        "`override` is for admins only; leave it out, or ask an admin or another reviewer \
         to act on this flag"
    )]
    OverrideNotAdmin,
    #[error(
        "this flag was raised on your own history, and nobody acts on their own flags; \
         ask another reviewer or an admin to act on it (an admin may send \"override\": true, \
         recorded as a self-action)"
    )]
    OwnFlag,
}

/// What the acting user asked for and what the store knows, for [`decide`].
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub actor: &'a User,
    /// The `user_id` of the flag (whose history raised it).
    pub flag_owner: &'a str,
    /// `"override": true` in the request.
    pub override_requested: bool,
    /// Users whose current role is reviewer or admin, the actor included.
    pub reviewers: usize,
}

/// Decides an action: `Ok(self_action)` when it may be recorded (`true`: a self-action, to be
/// marked so), or why not.
pub fn decide(r: Request<'_>) -> Result<bool, Refusal> {
    if !r.actor.role.can_review() {
        return Err(Refusal::NotReviewer);
    }
    if r.override_requested && r.actor.role != Role::Admin {
        return Err(Refusal::OverrideNotAdmin);
    }
    if r.flag_owner != r.actor.id {
        return Ok(false);
    }
    // The actor is a reviewer or admin, so `reviewers <= 1` means nobody else could act.
    if r.reviewers <= 1 || r.override_requested {
        return Ok(true);
    }
    Err(Refusal::OwnFlag)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(id: &str, role: Role) -> User {
        User { id: id.into(), email: format!("{id}@example.test"), role }
    }

    fn req<'a>(actor: &'a User, owner: &'a str, ov: bool, n: usize) -> Request<'a> {
        Request { actor, flag_owner: owner, override_requested: ov, reviewers: n }
    }

    #[test]
    fn others_flags_are_plain_actions() {
        for role in [Role::Reviewer, Role::Admin] {
            let a = user("a", role);
            assert_eq!(decide(req(&a, "b", false, 3)), Ok(false));
            assert_eq!(decide(req(&a, "b", false, 1)), Ok(false));
        }
        let admin = user("a", Role::Admin);
        assert_eq!(decide(req(&admin, "b", true, 3)), Ok(false), "override on another's flag");
    }

    #[test]
    fn own_flags_are_refused_unless_alone_or_overridden_by_an_admin() {
        let rev = user("a", Role::Reviewer);
        let admin = user("a", Role::Admin);
        assert_eq!(decide(req(&rev, "a", false, 2)), Err(Refusal::OwnFlag));
        assert_eq!(decide(req(&admin, "a", false, 2)), Err(Refusal::OwnFlag));
        assert_eq!(decide(req(&rev, "a", true, 2)), Err(Refusal::OverrideNotAdmin));
        assert_eq!(decide(req(&admin, "a", true, 2)), Ok(true));
        // The sole reviewer/admin of a store.
        assert_eq!(decide(req(&rev, "a", false, 1)), Ok(true));
        assert_eq!(decide(req(&admin, "a", false, 1)), Ok(true));
    }

    #[test]
    fn members_never_act_and_overrides_are_for_admins() {
        let m = user("m", Role::Member);
        assert_eq!(decide(req(&m, "x", false, 1)), Err(Refusal::NotReviewer));
        assert_eq!(decide(req(&m, "m", true, 0)), Err(Refusal::NotReviewer));
        let rev = user("r", Role::Reviewer);
        assert_eq!(decide(req(&rev, "x", true, 3)), Err(Refusal::OverrideNotAdmin));
    }
}
