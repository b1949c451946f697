-- PostgreSQL review store, schema version 4: least privilege (run by the owner role through
-- `airlockd review migrate`, which also (re)writes the grants: docs/review.md "Grants").
--
-- Contract of the flag-state function (the only way the runtime role records a flag state;
-- it has no INSERT on flag_states):
--
--   airlock_flag_state(secret text, flag_id text, state text, note text, override boolean)
--     RETURNS TABLE (n bigint, actor text, self boolean, at_us bigint)
--
--   * `secret` is the caller's bearer token (later also a console-session secret); the
--     function hashes it (sha256) and looks the hash up, unrevoked. There is no actor
--     parameter: the actor is the token's user.
--   * The actor's current role must be reviewer or admin.
--   * `self` (the flag was raised on the actor's own history) is computed here. A self-action
--     is allowed only for the sole reviewer/admin of the store, or for an admin passing
--     `override` = true. `override` from anyone else grants nothing (and is ignored when the
--     action is not a self-action), so a caller may pass its own "self action allowed"
--     decision as `override` without widening the rule.
--   * No row returned: no such flag. One row: the appended state row (`at_us`: microseconds
--     since the epoch of the database clock).
--   * Refusals raise SQLSTATE 'AL401' (no, unknown or revoked credential) or 'AL403' (not a
--     reviewer/admin, or a self-action refused); the message says why.

-- Migration 0003 (self-actions) adds this column too; IF NOT EXISTS keeps either order working.
ALTER TABLE flag_states ADD COLUMN IF NOT EXISTS self boolean NOT NULL DEFAULT false;

CREATE FUNCTION airlock_flag_state(secret text, flag_id text, state text, note text, override boolean)
RETURNS TABLE (n bigint, actor text, self boolean, at_us bigint)
LANGUAGE plpgsql SECURITY DEFINER
-- Pinned again below with the store's own schema (ALTER FUNCTION ... SET search_path).
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
  SELECT f.user_id INTO v_owner FROM flags f WHERE f.id = airlock_flag_state.flag_id;
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
  RETURN QUERY
    INSERT INTO flag_states AS s (flag_id, state, note, actor, at, self)
    VALUES (airlock_flag_state.flag_id, airlock_flag_state.state, airlock_flag_state.note,
            v_user, now(), v_self)
    RETURNING s.n, s.actor, s.self, (extract(epoch from s.at) * 1000000)::int8;
END $$;
REVOKE ALL ON FUNCTION airlock_flag_state(text, text, text, text, boolean) FROM PUBLIC;
-- Writing SECURITY DEFINER functions safely: only trusted schemas, pg_temp last.
DO $$ BEGIN
  EXECUTE format('ALTER FUNCTION airlock_flag_state(text, text, text, text, boolean) SET search_path = pg_catalog, %I, pg_temp',
                 current_schema());
END $$;

-- received_at (and a flag's created_at) come from the database clock: DEFAULT now(), and a
-- supplied value other than the transaction's now() is refused, so no role backdates evidence.
CREATE FUNCTION airlock_received_now() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.received_at IS DISTINCT FROM now() THEN
    RAISE EXCEPTION 'received_at is set by the database; do not supply it (% on %)', TG_OP, TG_TABLE_NAME
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  RETURN NEW;
END $$;
CREATE FUNCTION airlock_created_now() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.created_at IS DISTINCT FROM now() THEN
    RAISE EXCEPTION 'created_at is set by the database; do not supply it (% on %)', TG_OP, TG_TABLE_NAME
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  RETURN NEW;
END $$;
ALTER TABLE events ALTER COLUMN received_at SET DEFAULT now();
ALTER TABLE event_keys ALTER COLUMN received_at SET DEFAULT now();
-- The WHEN clause is evaluated by the executor, so the (plpgsql) function runs only for a
-- row it refuses: the common insert pays an expression, not a function call.
CREATE TRIGGER events_received_now BEFORE INSERT ON events FOR EACH ROW
  WHEN (NEW.received_at IS DISTINCT FROM now()) EXECUTE FUNCTION airlock_received_now();
CREATE TRIGGER event_keys_received_now BEFORE INSERT ON event_keys FOR EACH ROW
  WHEN (NEW.received_at IS DISTINCT FROM now()) EXECUTE FUNCTION airlock_received_now();
CREATE TRIGGER flags_created_now BEFORE INSERT ON flags FOR EACH ROW
  WHEN (NEW.created_at IS DISTINCT FROM now()) EXECUTE FUNCTION airlock_created_now();

-- TRUNCATE of a partition names the partition, not `events`, so each one carries its own
-- statement trigger (`airlockd review maintain` adds it to the partitions it creates).
CREATE TRIGGER schema_migrations_no_truncate BEFORE TRUNCATE ON schema_migrations
  FOR EACH STATEMENT EXECUTE FUNCTION airlock_insert_only();
REVOKE TRUNCATE, UPDATE, DELETE ON schema_migrations FROM PUBLIC;
DO $$
DECLARE p regclass;
BEGIN
  FOR p IN SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = 'events'::regclass LOOP
    EXECUTE format('CREATE TRIGGER no_truncate BEFORE TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION airlock_insert_only()', p);
  END LOOP;
END $$;
