-- PostgreSQL review store, schema version 1 (run by the owner role: `airlockd review migrate`).
-- Insert-only: UPDATE and DELETE are rejected by trigger on every table, TRUNCATE is revoked
-- (and rejected by trigger); revocations, role changes and flag states are appended rows.
CREATE TABLE users (id text PRIMARY KEY, email text NOT NULL UNIQUE, created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE user_roles (n bigserial PRIMARY KEY, user_id text NOT NULL REFERENCES users(id),
  role text NOT NULL CHECK (role IN ('admin','reviewer','member')), at timestamptz NOT NULL DEFAULT now());
CREATE INDEX user_roles_user ON user_roles(user_id, n);
CREATE TABLE tokens (id text PRIMARY KEY, user_id text NOT NULL REFERENCES users(id),
  hash bytea NOT NULL UNIQUE, created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE token_revocations (n bigserial PRIMARY KEY, token_id text NOT NULL REFERENCES tokens(id),
  at timestamptz NOT NULL DEFAULT now());
CREATE INDEX token_revocations_token ON token_revocations(token_id);
CREATE SEQUENCE events_pk_seq;
-- Partitioned by month of the server's received_at; `airlockd review maintain` creates months
-- ahead so events_default stays empty.
CREATE TABLE events (pk bigint NOT NULL, user_id text NOT NULL, source text NOT NULL, id text NOT NULL,
  type text NOT NULL, ts bigint NOT NULL, session text, seq bigint, boot text,
  received_at timestamptz NOT NULL, payload text NOT NULL,
  PRIMARY KEY (pk, received_at)) PARTITION BY RANGE (received_at);
CREATE INDEX events_user ON events(user_id, pk);
CREATE INDEX events_session ON events(user_id, session, pk);
CREATE TABLE events_default PARTITION OF events DEFAULT;
-- Dedup key table: one row per (user, source, id), inserted with its event in one statement.
CREATE TABLE event_keys (user_id text NOT NULL, source text NOT NULL, id text NOT NULL,
  pk bigint NOT NULL, received_at timestamptz NOT NULL, PRIMARY KEY (user_id, source, id));
CREATE TABLE flags (n bigserial UNIQUE, id text PRIMARY KEY, rule_id text NOT NULL, title text NOT NULL,
  severity text NOT NULL, user_id text NOT NULL, session text, detail text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE flag_events (flag_id text NOT NULL REFERENCES flags(id), event_pk bigint NOT NULL,
  PRIMARY KEY (flag_id, event_pk));
CREATE INDEX flag_events_event ON flag_events(event_pk);
CREATE TABLE flag_states (n bigserial PRIMARY KEY, flag_id text NOT NULL REFERENCES flags(id),
  state text NOT NULL CHECK (state IN ('open','acknowledged','resolved','dismissed')),
  note text, actor text NOT NULL, at timestamptz NOT NULL);
CREATE INDEX flag_states_flag ON flag_states(flag_id, n);

CREATE FUNCTION airlock_insert_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'review store is insert-only: % on % rejected', TG_OP, TG_TABLE_NAME
    USING ERRCODE = 'insufficient_privilege';
END $$;
CREATE TRIGGER users_insert_only BEFORE UPDATE OR DELETE ON users FOR EACH ROW EXECUTE FUNCTION airlock_insert_only();
CREATE TRIGGER users_no_truncate BEFORE TRUNCATE ON users FOR EACH STATEMENT EXECUTE FUNCTION airlock_insert_only();
REVOKE TRUNCATE, UPDATE, DELETE ON users FROM PUBLIC;
CREATE TRIGGER user_roles_insert_only BEFORE UPDATE OR DELETE ON user_roles FOR EACH ROW EXECUTE FUNCTION airlock_insert_only();
CREATE TRIGGER user_roles_no_truncate BEFORE TRUNCATE ON user_roles FOR EACH STATEMENT EXECUTE FUNCTION airlock_insert_only();
REVOKE TRUNCATE, UPDATE, DELETE ON user_roles FROM PUBLIC;
CREATE TRIGGER tokens_insert_only BEFORE UPDATE OR DELETE ON tokens FOR EACH ROW EXECUTE FUNCTION airlock_insert_only();
CREATE TRIGGER tokens_no_truncate BEFORE TRUNCATE ON tokens FOR EACH STATEMENT EXECUTE FUNCTION airlock_insert_only();
REVOKE TRUNCATE, UPDATE, DELETE ON tokens FROM PUBLIC;
CREATE TRIGGER token_revocations_insert_only BEFORE UPDATE OR DELETE ON token_revocations FOR EACH ROW EXECUTE FUNCTION airlock_insert_only();
CREATE TRIGGER token_revocations_no_truncate BEFORE TRUNCATE ON token_revocations FOR EACH STATEMENT EXECUTE FUNCTION airlock_insert_only();
REVOKE TRUNCATE, UPDATE, DELETE ON token_revocations FROM PUBLIC;
CREATE TRIGGER events_insert_only BEFORE UPDATE OR DELETE ON events FOR EACH ROW EXECUTE FUNCTION airlock_insert_only();
CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events FOR EACH STATEMENT EXECUTE FUNCTION airlock_insert_only();
REVOKE TRUNCATE, UPDATE, DELETE ON events FROM PUBLIC;
CREATE TRIGGER event_keys_insert_only BEFORE UPDATE OR DELETE ON event_keys FOR EACH ROW EXECUTE FUNCTION airlock_insert_only();
CREATE TRIGGER event_keys_no_truncate BEFORE TRUNCATE ON event_keys FOR EACH STATEMENT EXECUTE FUNCTION airlock_insert_only();
REVOKE TRUNCATE, UPDATE, DELETE ON event_keys FROM PUBLIC;
CREATE TRIGGER flags_insert_only BEFORE UPDATE OR DELETE ON flags FOR EACH ROW EXECUTE FUNCTION airlock_insert_only();
CREATE TRIGGER flags_no_truncate BEFORE TRUNCATE ON flags FOR EACH STATEMENT EXECUTE FUNCTION airlock_insert_only();
REVOKE TRUNCATE, UPDATE, DELETE ON flags FROM PUBLIC;
CREATE TRIGGER flag_events_insert_only BEFORE UPDATE OR DELETE ON flag_events FOR EACH ROW EXECUTE FUNCTION airlock_insert_only();
CREATE TRIGGER flag_events_no_truncate BEFORE TRUNCATE ON flag_events FOR EACH STATEMENT EXECUTE FUNCTION airlock_insert_only();
REVOKE TRUNCATE, UPDATE, DELETE ON flag_events FROM PUBLIC;
CREATE TRIGGER flag_states_insert_only BEFORE UPDATE OR DELETE ON flag_states FOR EACH ROW EXECUTE FUNCTION airlock_insert_only();
CREATE TRIGGER flag_states_no_truncate BEFORE TRUNCATE ON flag_states FOR EACH STATEMENT EXECUTE FUNCTION airlock_insert_only();
REVOKE TRUNCATE, UPDATE, DELETE ON flag_states FROM PUBLIC;
