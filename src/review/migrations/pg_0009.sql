-- PostgreSQL review store, migration 9: flag assignment (docs/api.md, `POST /api/v1/flags/{id}`
-- with `"action": "assign"`). An assignment is a `flag_states` row (`assignment` = true) that
-- keeps the flag's state at that moment and names the assigned user (`assignee`; NULL on an
-- assignment row: unassigned). Older rows read as state actions (false, NULL): a constant
-- default and a nullable column rewrite no rows and fire no UPDATE trigger.
ALTER TABLE flag_states ADD COLUMN assignment boolean NOT NULL DEFAULT false;
ALTER TABLE flag_states ADD COLUMN assignee text REFERENCES users(id);
ALTER TABLE flag_states ADD CONSTRAINT flag_states_assignee_only_on_assignments
  CHECK (assignee IS NULL OR assignment);

-- Both flag functions below take their checks from one helper, so the credential, role and
-- self-action rule cannot drift apart:
--
--   airlock_flag_actor(secret text, flag_id text, override boolean)
--     RETURNS TABLE (actor text, self boolean)
--
--   * the checks of `airlock_flag_state` as migration 0004 defines them: SQLSTATE 'AL401' for
--     no, unknown or revoked credential, 'AL403' for not a reviewer/admin or a refused
--     self-action; no row: no such flag;
--   * it locks the flag's row (FOR NO KEY UPDATE, which leaves foreign-key checks of
--     concurrent ingests alone), so a state action and an assignment on one flag run one after
--     the other and an assignment never re-appends a state just replaced.
--   It is not callable by the runtime role (no EXECUTE); the SECURITY DEFINER functions run it
--   as the owner.
--
-- Contract of the assignment function (the runtime role still has no INSERT on flag_states):
--
--   airlock_flag_assign(secret text, flag_id text, assignee text, note text, override boolean)
--     RETURNS TABLE (n bigint, actor text, self boolean, at_us bigint)
--
--   * `secret`, `override` and the refusals: as `airlock_flag_actor`.
--   * `assignee` is a user id, or NULL to unassign. A user that does not exist, or whose
--     current role is not reviewer or admin, raises SQLSTATE 'AL400'.
--   * The row keeps the flag's current state (its latest row's, else 'open').
CREATE FUNCTION airlock_flag_actor(secret text, flag_id text, override boolean)
RETURNS TABLE (actor text, self boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_user text;
  v_role text;
  v_owner text;
  v_self boolean;
  v_reviewers bigint;
BEGIN
  IF secret IS NULL OR secret = '' THEN
    RAISE EXCEPTION 'no credential presented' USING ERRCODE = 'AL401';
  END IF;
  SELECT t.user_id INTO v_user FROM tokens t
   WHERE t.hash = sha256(convert_to(secret, 'UTF8'))
     AND NOT EXISTS (SELECT 1 FROM token_revocations r WHERE r.token_id = t.id);
  IF v_user IS NULL THEN
    RAISE EXCEPTION 'invalid or revoked credential' USING ERRCODE = 'AL401';
  END IF;
  SELECT r.role INTO v_role FROM user_roles r WHERE r.user_id = v_user ORDER BY r.n DESC LIMIT 1;
  IF v_role IS DISTINCT FROM 'reviewer' AND v_role IS DISTINCT FROM 'admin' THEN
    RAISE EXCEPTION 'only reviewers and admins act on flags' USING ERRCODE = 'AL403';
  END IF;
  SELECT f.user_id INTO v_owner FROM flags f WHERE f.id = airlock_flag_actor.flag_id
    FOR NO KEY UPDATE;
  IF v_owner IS NULL THEN
    RETURN;
  END IF;
  v_self := v_owner = v_user;
  IF v_self AND NOT (coalesce(override, false) AND v_role = 'admin') THEN
    SELECT count(*) INTO v_reviewers FROM users u
     WHERE (SELECT r.role FROM user_roles r WHERE r.user_id = u.id ORDER BY r.n DESC LIMIT 1)
           IN ('reviewer', 'admin');
    IF v_reviewers > 1 THEN
      RAISE EXCEPTION 'this flag was raised on your own history: another reviewer must act on it (or an admin with override)'
        USING ERRCODE = 'AL403';
    END IF;
  END IF;
  RETURN QUERY SELECT v_user, v_self;
END $$;
REVOKE ALL ON FUNCTION airlock_flag_actor(text, text, boolean) FROM PUBLIC;

CREATE FUNCTION airlock_flag_assign(secret text, flag_id text, assignee text, note text, override boolean)
RETURNS TABLE (n bigint, actor text, self boolean, at_us bigint)
LANGUAGE plpgsql SECURITY DEFINER
-- Pinned again below with the store's own schema (ALTER FUNCTION ... SET search_path).
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_user text;
  v_self boolean;
  v_assignee_role text;
  v_state text;
BEGIN
  SELECT a.actor, a.self INTO v_user, v_self
    FROM airlock_flag_actor(secret, airlock_flag_assign.flag_id, override) a;
  IF v_user IS NULL THEN
    RETURN;
  END IF;
  IF assignee IS NOT NULL THEN
    IF NOT EXISTS (SELECT 1 FROM users u WHERE u.id = airlock_flag_assign.assignee) THEN
      RAISE EXCEPTION 'no user with id %: assign a reviewer or admin', assignee USING ERRCODE = 'AL400';
    END IF;
    SELECT r.role INTO v_assignee_role FROM user_roles r
     WHERE r.user_id = airlock_flag_assign.assignee ORDER BY r.n DESC LIMIT 1;
    IF v_assignee_role IS DISTINCT FROM 'reviewer' AND v_assignee_role IS DISTINCT FROM 'admin' THEN
      RAISE EXCEPTION 'only reviewers and admins can be assigned a flag' USING ERRCODE = 'AL400';
    END IF;
  END IF;
  SELECT coalesce((SELECT s.state FROM flag_states s WHERE s.flag_id = airlock_flag_assign.flag_id
                    ORDER BY s.n DESC LIMIT 1), 'open') INTO v_state;
  RETURN QUERY
    INSERT INTO flag_states AS s (flag_id, state, note, actor, at, self, assignment, assignee)
    VALUES (airlock_flag_assign.flag_id, v_state, airlock_flag_assign.note, v_user, now(), v_self,
            true, airlock_flag_assign.assignee)
    RETURNING s.n, s.actor, s.self, (extract(epoch from s.at) * 1000000)::int8;
END $$;
REVOKE ALL ON FUNCTION airlock_flag_assign(text, text, text, text, boolean) FROM PUBLIC;

-- `airlock_flag_state` (migration 0004) again, its checks now `airlock_flag_actor`'s (the same
-- checks, plus the flag's row lock). CREATE OR REPLACE keeps its owner and grants; its SET
-- clause is replaced, so the search_path is pinned again below.
CREATE OR REPLACE FUNCTION airlock_flag_state(secret text, flag_id text, state text, note text, override boolean)
RETURNS TABLE (n bigint, actor text, self boolean, at_us bigint)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_user text;
  v_self boolean;
BEGIN
  SELECT a.actor, a.self INTO v_user, v_self
    FROM airlock_flag_actor(secret, airlock_flag_state.flag_id, override) a;
  IF v_user IS NULL THEN
    RETURN;
  END IF;
  RETURN QUERY
    INSERT INTO flag_states AS s (flag_id, state, note, actor, at, self)
    VALUES (airlock_flag_state.flag_id, airlock_flag_state.state, airlock_flag_state.note,
            v_user, now(), v_self)
    RETURNING s.n, s.actor, s.self, (extract(epoch from s.at) * 1000000)::int8;
END $$;
REVOKE ALL ON FUNCTION airlock_flag_state(text, text, text, text, boolean) FROM PUBLIC;
-- Writing SECURITY DEFINER functions safely: only trusted schemas, pg_temp last.
DO $$ BEGIN
  EXECUTE format('ALTER FUNCTION airlock_flag_actor(text, text, boolean) SET search_path = pg_catalog, %I, pg_temp',
                 current_schema());
  EXECUTE format('ALTER FUNCTION airlock_flag_assign(text, text, text, text, boolean) SET search_path = pg_catalog, %I, pg_temp',
                 current_schema());
  EXECUTE format('ALTER FUNCTION airlock_flag_state(text, text, text, text, boolean) SET search_path = pg_catalog, %I, pg_temp',
                 current_schema());
END $$;
