-- PostgreSQL review store, migration 11: action gates on the review plane (docs/gates.md "With
-- a review server", docs/api.md "Gates"). A gate is opened once (`gates`, inserted by the
-- runtime role) and decided at most once (`gate_decisions`, keyed by the gate, written only by
-- the two SECURITY DEFINER functions below). A gate with no decision is pending until its
-- `deadline` and expired after it. `requested_at` comes from the database clock (a supplied
-- value is refused) and `deadline` is computed from it; the digest must be the SHA-256 of the
-- canonical action, so the text a reviewer reads is the one a decision is bound to.
--
-- Contract of the decision function (the runtime role has no INSERT on gate_decisions):
--
--   airlock_gate_decide(secret text, gate_id text, state text, note text, digest text,
--                       override boolean, step_up boolean)
--     RETURNS TABLE (actor text, self boolean, at_us bigint, outcome text)
--
--   * `secret`: a bearer token's secret or a live console session's id, checked as
--     `airlock_flag_actor` checks it (SQLSTATE 'AL401' when it is not a live credential).
--   * No row: no such gate. `outcome` 'not_pending': it was decided or its deadline passed
--     (database clock); 'digest': `digest` is given and is not the gate's; 'done': the
--     decision row was appended (`at_us`: microseconds of the database clock).
--   * `state` 'abandoned': only the requester (or an admin). 'approved'/'denied': a reviewer
--     or admin; the requester may deny, and may approve only when the gate allows
--     self-approval, they are the store's sole reviewer/admin, or they are an admin passing
--     `override`. `self` is computed here. A `high` gate needs `step_up` (the server verified
--     the decider's password; the database cannot). Refusals raise 'AL403'.
--
--   airlock_gate_expire(max integer) RETURNS TABLE (gate_id text, at_us bigint)
--     Appends an 'expired' row (`at`: the deadline) for up to `max` gates whose deadline
--     passed within the last seven days and that have no decision; returns them. (Older
--     ones read as expired all the same; the row is what carries the `gate.expired` event.) Concurrent callers never write a
--     gate twice (the primary key), so several server instances may sweep at once.
CREATE TABLE gates (n bigserial UNIQUE, id text PRIMARY KEY, user_id text NOT NULL REFERENCES users(id),
  kind text NOT NULL CHECK (kind IN ('egress', 'tool', 'external')),
  session text, repo text, method text, host text, port integer CHECK (port BETWEEN 1 AND 65535),
  request text, action text NOT NULL, digest text NOT NULL,
  severity text NOT NULL CHECK (severity IN ('low', 'medium', 'high')),
  rule text, layer text, policy text, local_id text, context text,
  self_approve boolean NOT NULL DEFAULT false,
  timeout_ms bigint NOT NULL CHECK (timeout_ms BETWEEN 1000 AND 3600000),
  requested_at timestamptz NOT NULL DEFAULT now(), deadline timestamptz NOT NULL);
CREATE INDEX gates_user ON gates(user_id, deadline);
CREATE INDEX gates_deadline ON gates(deadline);
CREATE TABLE gate_decisions (gate_id text PRIMARY KEY REFERENCES gates(id),
  state text NOT NULL CHECK (state IN ('approved', 'denied', 'abandoned', 'expired')),
  actor text REFERENCES users(id), note text, self boolean NOT NULL DEFAULT false,
  step_up boolean NOT NULL DEFAULT false, at timestamptz NOT NULL DEFAULT now(),
  CHECK ((state = 'expired') = (actor IS NULL)));

CREATE FUNCTION airlock_gate_opened() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.requested_at IS DISTINCT FROM now() THEN
    RAISE EXCEPTION 'requested_at is set by the database; do not supply it'
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  IF NEW.digest IS DISTINCT FROM 'sha256:' || encode(sha256(convert_to(NEW.action, 'UTF8')), 'hex') THEN
    RAISE EXCEPTION 'a gate''s digest must be the SHA-256 of its action' USING ERRCODE = 'check_violation';
  END IF;
  NEW.deadline := NEW.requested_at + NEW.timeout_ms * interval '1 millisecond';
  RETURN NEW;
END $$;
CREATE TRIGGER gates_opened BEFORE INSERT ON gates FOR EACH ROW EXECUTE FUNCTION airlock_gate_opened();

DO $$
DECLARE t text;
BEGIN
  FOREACH t IN ARRAY ARRAY['gates', 'gate_decisions'] LOOP
    EXECUTE format('CREATE TRIGGER %I BEFORE UPDATE OR DELETE ON %I FOR EACH ROW EXECUTE FUNCTION airlock_insert_only()', t || '_insert_only', t);
    EXECUTE format('CREATE TRIGGER %I BEFORE TRUNCATE ON %I FOR EACH STATEMENT EXECUTE FUNCTION airlock_insert_only()', t || '_no_truncate', t);
    EXECUTE format('REVOKE TRUNCATE, UPDATE, DELETE ON %I FROM PUBLIC', t);
  END LOOP;
END $$;

-- The user a credential names, with their current role: a token's secret, or a live console
-- session's id (as `airlock_flag_actor`, migration 0010). Not callable by the runtime role.
CREATE FUNCTION airlock_credential(secret text) RETURNS TABLE (user_id text, role text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_user text;
BEGIN
  IF secret IS NULL OR secret = '' THEN
    RAISE EXCEPTION 'no credential presented' USING ERRCODE = 'AL401';
  END IF;
  SELECT t.user_id INTO v_user FROM tokens t
   WHERE t.hash = sha256(convert_to(secret, 'UTF8'))
     AND NOT EXISTS (SELECT 1 FROM token_revocations r WHERE r.token_id = t.id);
  IF v_user IS NULL THEN
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
  RETURN QUERY SELECT v_user,
    (SELECT r.role FROM user_roles r WHERE r.user_id = v_user ORDER BY r.n DESC LIMIT 1);
END $$;
REVOKE ALL ON FUNCTION airlock_credential(text) FROM PUBLIC;

CREATE FUNCTION airlock_gate_decide(secret text, gate_id text, state text, note text, digest text,
                                    override boolean, step_up boolean)
RETURNS TABLE (actor text, self boolean, at_us bigint, outcome text)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_user text;
  v_role text;
  g record;
  v_self boolean;
  v_reviewer boolean;
  v_reviewers bigint;
  v_at timestamptz;
BEGIN
  SELECT c.user_id, c.role INTO v_user, v_role FROM airlock_credential(secret) c;
  SELECT x.id, x.user_id, x.digest, x.severity, x.self_approve, x.deadline INTO g
    FROM gates x WHERE x.id = airlock_gate_decide.gate_id FOR UPDATE;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  IF EXISTS (SELECT 1 FROM gate_decisions d WHERE d.gate_id = g.id) OR clock_timestamp() >= g.deadline THEN
    RETURN QUERY SELECT NULL::text, false, NULL::int8, 'not_pending'::text;
    RETURN;
  END IF;
  IF airlock_gate_decide.digest IS NOT NULL AND airlock_gate_decide.digest <> g.digest THEN
    RETURN QUERY SELECT NULL::text, false, NULL::int8, 'digest'::text;
    RETURN;
  END IF;
  v_self := g.user_id = v_user;
  v_reviewer := v_role IN ('reviewer', 'admin');
  IF coalesce(override, false) AND v_role IS DISTINCT FROM 'admin' THEN
    RAISE EXCEPTION '`override` is for admins only' USING ERRCODE = 'AL403';
  END IF;
  IF state = 'abandoned' THEN
    IF NOT v_self AND v_role IS DISTINCT FROM 'admin' THEN
      RAISE EXCEPTION 'only the requester withdraws a gate' USING ERRCODE = 'AL403';
    END IF;
  ELSIF state IN ('approved', 'denied') THEN
    IF NOT v_self AND NOT coalesce(v_reviewer, false) THEN
      RAISE EXCEPTION 'only reviewers and admins decide other people''s gates' USING ERRCODE = 'AL403';
    END IF;
    IF v_self AND state = 'approved' AND NOT g.self_approve
       AND NOT (coalesce(v_reviewer, false) AND coalesce(override, false)) THEN
      SELECT count(*) INTO v_reviewers FROM users u
       WHERE (SELECT r.role FROM user_roles r WHERE r.user_id = u.id ORDER BY r.n DESC LIMIT 1)
             IN ('reviewer', 'admin');
      IF NOT coalesce(v_reviewer, false) OR v_reviewers > 1 THEN
        RAISE EXCEPTION 'nobody approves their own gate: another reviewer must (or an admin with override)'
          USING ERRCODE = 'AL403';
      END IF;
    END IF;
    IF g.severity = 'high' AND NOT coalesce(step_up, false) THEN
      RAISE EXCEPTION 'step_up_required: a decision on a high-severity gate needs the decider''s password'
        USING ERRCODE = 'AL403';
    END IF;
  ELSE
    RAISE EXCEPTION 'state must be approved, denied or abandoned' USING ERRCODE = 'AL400';
  END IF;
  INSERT INTO gate_decisions AS d (gate_id, state, actor, note, self, step_up)
    VALUES (g.id, airlock_gate_decide.state, v_user, airlock_gate_decide.note, v_self,
            state <> 'abandoned' AND coalesce(step_up, false))
    ON CONFLICT ON CONSTRAINT gate_decisions_pkey DO NOTHING
    RETURNING d.at INTO v_at;
  IF v_at IS NULL THEN
    RETURN QUERY SELECT NULL::text, false, NULL::int8, 'not_pending'::text;
    RETURN;
  END IF;
  RETURN QUERY SELECT v_user, v_self, (extract(epoch from v_at) * 1000000)::int8, 'done'::text;
END $$;
REVOKE ALL ON FUNCTION airlock_gate_decide(text, text, text, text, text, boolean, boolean) FROM PUBLIC;

CREATE FUNCTION airlock_gate_expire(max integer) RETURNS TABLE (gate_id text, at_us bigint)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN QUERY
    INSERT INTO gate_decisions AS d (gate_id, state, at)
    SELECT g.id, 'expired', g.deadline FROM gates g
     WHERE g.deadline <= now() AND g.deadline > now() - interval '7 days'
       AND NOT EXISTS (SELECT 1 FROM gate_decisions x WHERE x.gate_id = g.id)
     ORDER BY g.deadline LIMIT greatest(max, 0)
    ON CONFLICT ON CONSTRAINT gate_decisions_pkey DO NOTHING
    RETURNING d.gate_id, (extract(epoch from d.at) * 1000000)::int8;
END $$;
REVOKE ALL ON FUNCTION airlock_gate_expire(integer) FROM PUBLIC;

DO $$ BEGIN
  EXECUTE format('ALTER FUNCTION airlock_credential(text) SET search_path = pg_catalog, %I, pg_temp',
                 current_schema());
  EXECUTE format('ALTER FUNCTION airlock_gate_decide(text, text, text, text, text, boolean, boolean) SET search_path = pg_catalog, %I, pg_temp',
                 current_schema());
  EXECUTE format('ALTER FUNCTION airlock_gate_expire(integer) SET search_path = pg_catalog, %I, pg_temp',
                 current_schema());
END $$;
