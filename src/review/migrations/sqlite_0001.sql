-- Embedded review store, schema version 1. Insert-only: every table rejects UPDATE and
-- DELETE by trigger; revocations, role changes and flag states are appended rows.
CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL);
CREATE TABLE users (id TEXT PRIMARY KEY, email TEXT NOT NULL UNIQUE, created_at INTEGER NOT NULL);
CREATE TABLE user_roles (n INTEGER PRIMARY KEY AUTOINCREMENT, user_id TEXT NOT NULL REFERENCES users(id),
  role TEXT NOT NULL CHECK (role IN ('admin','reviewer','member')), at INTEGER NOT NULL);
CREATE INDEX user_roles_user ON user_roles(user_id, n);
CREATE TABLE tokens (id TEXT PRIMARY KEY, user_id TEXT NOT NULL REFERENCES users(id),
  hash BLOB NOT NULL UNIQUE, created_at INTEGER NOT NULL);
CREATE TABLE token_revocations (n INTEGER PRIMARY KEY AUTOINCREMENT,
  token_id TEXT NOT NULL REFERENCES tokens(id), at INTEGER NOT NULL);
CREATE INDEX token_revocations_token ON token_revocations(token_id);
CREATE TABLE events (pk INTEGER PRIMARY KEY AUTOINCREMENT, user_id TEXT NOT NULL, source TEXT NOT NULL,
  id TEXT NOT NULL, type TEXT NOT NULL, ts INTEGER NOT NULL, session TEXT, seq INTEGER, boot TEXT,
  received_at INTEGER NOT NULL, payload TEXT NOT NULL);
CREATE INDEX events_user ON events(user_id, pk);
CREATE INDEX events_session ON events(user_id, session, pk);
CREATE TABLE event_keys (user_id TEXT NOT NULL, source TEXT NOT NULL, id TEXT NOT NULL,
  pk INTEGER NOT NULL, received_at INTEGER NOT NULL, PRIMARY KEY (user_id, source, id)) WITHOUT ROWID;
CREATE TABLE flags (n INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, rule_id TEXT NOT NULL,
  title TEXT NOT NULL, severity TEXT NOT NULL, user_id TEXT NOT NULL, session TEXT, detail TEXT NOT NULL,
  created_at INTEGER NOT NULL);
CREATE TABLE flag_events (flag_id TEXT NOT NULL, event_pk INTEGER NOT NULL, PRIMARY KEY (flag_id, event_pk)) WITHOUT ROWID;
CREATE INDEX flag_events_event ON flag_events(event_pk);
CREATE TABLE flag_states (n INTEGER PRIMARY KEY AUTOINCREMENT, flag_id TEXT NOT NULL, state TEXT NOT NULL,
  note TEXT, actor TEXT NOT NULL, at INTEGER NOT NULL);
CREATE INDEX flag_states_flag ON flag_states(flag_id, n);
CREATE TRIGGER schema_migrations_no_update BEFORE UPDATE ON schema_migrations BEGIN SELECT RAISE(ABORT, 'review store is insert-only: UPDATE on schema_migrations rejected'); END;
CREATE TRIGGER schema_migrations_no_delete BEFORE DELETE ON schema_migrations BEGIN SELECT RAISE(ABORT, 'review store is insert-only: DELETE on schema_migrations rejected'); END;
CREATE TRIGGER users_no_update BEFORE UPDATE ON users BEGIN SELECT RAISE(ABORT, 'review store is insert-only: UPDATE on users rejected'); END;
CREATE TRIGGER users_no_delete BEFORE DELETE ON users BEGIN SELECT RAISE(ABORT, 'review store is insert-only: DELETE on users rejected'); END;
CREATE TRIGGER user_roles_no_update BEFORE UPDATE ON user_roles BEGIN SELECT RAISE(ABORT, 'review store is insert-only: UPDATE on user_roles rejected'); END;
CREATE TRIGGER user_roles_no_delete BEFORE DELETE ON user_roles BEGIN SELECT RAISE(ABORT, 'review store is insert-only: DELETE on user_roles rejected'); END;
CREATE TRIGGER tokens_no_update BEFORE UPDATE ON tokens BEGIN SELECT RAISE(ABORT, 'review store is insert-only: UPDATE on tokens rejected'); END;
CREATE TRIGGER tokens_no_delete BEFORE DELETE ON tokens BEGIN SELECT RAISE(ABORT, 'review store is insert-only: DELETE on tokens rejected'); END;
CREATE TRIGGER token_revocations_no_update BEFORE UPDATE ON token_revocations BEGIN SELECT RAISE(ABORT, 'review store is insert-only: UPDATE on token_revocations rejected'); END;
CREATE TRIGGER token_revocations_no_delete BEFORE DELETE ON token_revocations BEGIN SELECT RAISE(ABORT, 'review store is insert-only: DELETE on token_revocations rejected'); END;
CREATE TRIGGER events_no_update BEFORE UPDATE ON events BEGIN SELECT RAISE(ABORT, 'review store is insert-only: UPDATE on events rejected'); END;
CREATE TRIGGER events_no_delete BEFORE DELETE ON events BEGIN SELECT RAISE(ABORT, 'review store is insert-only: DELETE on events rejected'); END;
CREATE TRIGGER event_keys_no_update BEFORE UPDATE ON event_keys BEGIN SELECT RAISE(ABORT, 'review store is insert-only: UPDATE on event_keys rejected'); END;
CREATE TRIGGER event_keys_no_delete BEFORE DELETE ON event_keys BEGIN SELECT RAISE(ABORT, 'review store is insert-only: DELETE on event_keys rejected'); END;
CREATE TRIGGER flags_no_update BEFORE UPDATE ON flags BEGIN SELECT RAISE(ABORT, 'review store is insert-only: UPDATE on flags rejected'); END;
CREATE TRIGGER flags_no_delete BEFORE DELETE ON flags BEGIN SELECT RAISE(ABORT, 'review store is insert-only: DELETE on flags rejected'); END;
CREATE TRIGGER flag_events_no_update BEFORE UPDATE ON flag_events BEGIN SELECT RAISE(ABORT, 'review store is insert-only: UPDATE on flag_events rejected'); END;
CREATE TRIGGER flag_events_no_delete BEFORE DELETE ON flag_events BEGIN SELECT RAISE(ABORT, 'review store is insert-only: DELETE on flag_events rejected'); END;
CREATE TRIGGER flag_states_no_update BEFORE UPDATE ON flag_states BEGIN SELECT RAISE(ABORT, 'review store is insert-only: UPDATE on flag_states rejected'); END;
CREATE TRIGGER flag_states_no_delete BEFORE DELETE ON flag_states BEGIN SELECT RAISE(ABORT, 'review store is insert-only: DELETE on flag_states rejected'); END;
