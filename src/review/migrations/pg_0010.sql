-- PostgreSQL review store, migration 10: flag actions from the console (docs/console.md).
-- `airlock_flag_actor` (migration 0009) again, its credential now a token's secret *or* a live
-- console session's id (the `__Host-airlock_session` cookie value): a session with no end
-- row, created less than a day ago by the database clock (the server applies its own, tighter
-- idle and absolute limits before it calls), whose user's current role is the role the
-- session began with. Everything else is unchanged: SQLSTATE 'AL401' for no, unknown, revoked
-- or ended credential, 'AL403' for not a reviewer/admin or a refused self-action, the flag
-- row lock, no row for no such flag.
--
-- Unlike a token, a console session row is written by the runtime role (it signs people in),
-- so this check does not hold against a compromised review process; docs/review.md says so.
-- CREATE OR REPLACE keeps the owner and the (absent) grants; its SET clause is replaced, so
-- the search_path is pinned again below.
CREATE OR REPLACE FUNCTION airlock_flag_actor(secret text, flag_id text, override boolean)
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
    -- A console session: not ended, younger than a day, and its user's role unchanged since
    -- it began (a role change ends every session of the user).
    SELECT c.user_id INTO v_user FROM console_sessions c
     WHERE c.hash = sha256(convert_to(secret, 'UTF8'))
       AND NOT EXISTS (SELECT 1 FROM console_session_ends e WHERE e.hash = c.hash)
       AND c.created_at > (extract(epoch from clock_timestamp()) * 1000000)::int8 - 86400000000
       AND c.role = (SELECT r.role FROM user_roles r WHERE r.user_id = c.user_id
                      ORDER BY r.n DESC LIMIT 1);
  END IF;
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
DO $$ BEGIN
  EXECUTE format('ALTER FUNCTION airlock_flag_actor(text, text, boolean) SET search_path = pg_catalog, %I, pg_temp',
                 current_schema());
END $$;
