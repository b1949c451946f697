-- PostgreSQL review store, migration 8: console sign-in (issue 17; docs/console.md). Passwords
-- are argon2id PHC strings, appended per user (the latest is current); invites, console
-- sessions and their "seen" and "ended" marks are appended rows too, and secrets (invite
-- tokens, session ids) are stored only as their SHA-256. Times are microseconds since the
-- epoch (the server's clock, which also judges session expiry).
--
-- Contract of the two SECURITY DEFINER functions (grants: docs/review.md "Grants"):
--
--   airlock_accept_invite(invite_hash bytea, phc text) RETURNS text
--     Consumes a one-time invite: if an invite with this SHA-256 exists, is unused and not
--     expired (database clock), records its use and the password row for its user and
--     returns the user id; otherwise returns NULL and writes nothing. Single use is the
--     primary key of invite_uses, so two concurrent calls cannot both succeed.
--
--   airlock_auth_log(email text, address text) RETURNS void
--     Records a failed sign-in for an email no user has, in the ring `auth_log` of the last
--     10,000 such rows (slot = seq mod 10000, overwritten in place). This ring is the one
--     table whose rows are updated: it holds no evidence and belongs to no one's history.
CREATE TABLE user_passwords (n bigserial PRIMARY KEY, user_id text NOT NULL REFERENCES users(id),
  phc text NOT NULL, at bigint NOT NULL);
CREATE INDEX user_passwords_user ON user_passwords(user_id, n);
CREATE TABLE invites (hash bytea PRIMARY KEY, user_id text NOT NULL REFERENCES users(id),
  created_at bigint NOT NULL, expires_at bigint NOT NULL);
CREATE TABLE invite_uses (hash bytea PRIMARY KEY REFERENCES invites(hash), at bigint NOT NULL);
CREATE TABLE console_sessions (hash bytea PRIMARY KEY, user_id text NOT NULL REFERENCES users(id),
  role text NOT NULL, epoch bigint NOT NULL, created_at bigint NOT NULL);
CREATE TABLE console_session_seen (hash bytea NOT NULL REFERENCES console_sessions(hash), at bigint NOT NULL);
CREATE INDEX console_session_seen_hash ON console_session_seen(hash, at);
CREATE TABLE console_session_ends (hash bytea NOT NULL REFERENCES console_sessions(hash),
  reason text NOT NULL, at bigint NOT NULL);
CREATE INDEX console_session_ends_hash ON console_session_ends(hash);
CREATE SEQUENCE auth_log_seq;
CREATE TABLE auth_log (slot integer PRIMARY KEY, seq bigint NOT NULL, at timestamptz NOT NULL DEFAULT now(),
  address text NOT NULL, email text NOT NULL);

DO $$
DECLARE t text;
BEGIN
  FOREACH t IN ARRAY ARRAY['user_passwords', 'invites', 'invite_uses', 'console_sessions',
                           'console_session_seen', 'console_session_ends'] LOOP
    EXECUTE format('CREATE TRIGGER %I BEFORE UPDATE OR DELETE ON %I FOR EACH ROW EXECUTE FUNCTION airlock_insert_only()', t || '_insert_only', t);
    EXECUTE format('CREATE TRIGGER %I BEFORE TRUNCATE ON %I FOR EACH STATEMENT EXECUTE FUNCTION airlock_insert_only()', t || '_no_truncate', t);
    EXECUTE format('REVOKE TRUNCATE, UPDATE, DELETE ON %I FROM PUBLIC', t);
  END LOOP;
END $$;
-- The ring refuses DELETE and TRUNCATE; its UPDATE is the overwrite inside airlock_auth_log.
CREATE TRIGGER auth_log_no_delete BEFORE DELETE ON auth_log FOR EACH ROW EXECUTE FUNCTION airlock_insert_only();
CREATE TRIGGER auth_log_no_truncate BEFORE TRUNCATE ON auth_log FOR EACH STATEMENT EXECUTE FUNCTION airlock_insert_only();
REVOKE TRUNCATE, UPDATE, DELETE ON auth_log FROM PUBLIC;

CREATE FUNCTION airlock_accept_invite(invite_hash bytea, phc text) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_user text;
  v_now bigint := (extract(epoch from clock_timestamp()) * 1000000)::int8;
BEGIN
  IF phc IS NULL OR phc NOT LIKE '$argon2id$%' THEN
    RAISE EXCEPTION 'the password must be an argon2id PHC string' USING ERRCODE = 'AL400';
  END IF;
  SELECT i.user_id INTO v_user FROM invites i
   WHERE i.hash = invite_hash AND i.expires_at > v_now
     AND NOT EXISTS (SELECT 1 FROM invite_uses u WHERE u.hash = i.hash);
  IF v_user IS NULL THEN
    RETURN NULL;
  END IF;
  INSERT INTO invite_uses (hash, at) VALUES (invite_hash, v_now) ON CONFLICT (hash) DO NOTHING;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  INSERT INTO user_passwords (user_id, phc, at) VALUES (v_user, airlock_accept_invite.phc, v_now);
  RETURN v_user;
END $$;
REVOKE ALL ON FUNCTION airlock_accept_invite(bytea, text) FROM PUBLIC;

CREATE FUNCTION airlock_auth_log(email text, address text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_seq bigint := nextval('auth_log_seq');
BEGIN
  INSERT INTO auth_log AS l (slot, seq, at, address, email)
  VALUES ((v_seq % 10000)::int, v_seq, now(), left(airlock_auth_log.address, 64), left(airlock_auth_log.email, 320))
  ON CONFLICT (slot) DO UPDATE SET seq = EXCLUDED.seq, at = EXCLUDED.at,
    address = EXCLUDED.address, email = EXCLUDED.email;
END $$;
REVOKE ALL ON FUNCTION airlock_auth_log(text, text) FROM PUBLIC;
-- Writing SECURITY DEFINER functions safely: only trusted schemas, pg_temp last.
DO $$ BEGIN
  EXECUTE format('ALTER FUNCTION airlock_accept_invite(bytea, text) SET search_path = pg_catalog, %I, pg_temp', current_schema());
  EXECUTE format('ALTER FUNCTION airlock_auth_log(text, text) SET search_path = pg_catalog, %I, pg_temp', current_schema());
END $$;
