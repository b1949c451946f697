-- Embedded review store, migration 7: console sign-in (issue 17; docs/console.md). Passwords
-- are argon2id PHC strings, appended per user (the latest is current); invites, console
-- sessions and their "seen" and "ended" marks are appended rows too, and secrets (invite
-- tokens, session ids) are stored only as their SHA-256. `auth_log` is the one table that
-- overwrites rows: a ring of the last 10,000 failed sign-ins for unknown emails (`slot` =
-- `seq` mod 10,000), which belong to no one's history; it holds no evidence and refuses DELETE.
CREATE TABLE user_passwords (n INTEGER PRIMARY KEY AUTOINCREMENT, user_id TEXT NOT NULL REFERENCES users(id),
  phc TEXT NOT NULL, at INTEGER NOT NULL);
CREATE INDEX user_passwords_user ON user_passwords(user_id, n);
CREATE TABLE invites (hash BLOB PRIMARY KEY, user_id TEXT NOT NULL REFERENCES users(id),
  created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL);
CREATE TABLE invite_uses (hash BLOB PRIMARY KEY REFERENCES invites(hash), at INTEGER NOT NULL);
CREATE TABLE console_sessions (hash BLOB PRIMARY KEY, user_id TEXT NOT NULL REFERENCES users(id),
  role TEXT NOT NULL, epoch INTEGER NOT NULL, created_at INTEGER NOT NULL);
CREATE TABLE console_session_seen (hash BLOB NOT NULL REFERENCES console_sessions(hash), at INTEGER NOT NULL);
CREATE INDEX console_session_seen_hash ON console_session_seen(hash, at);
CREATE TABLE console_session_ends (hash BLOB NOT NULL REFERENCES console_sessions(hash),
  reason TEXT NOT NULL, at INTEGER NOT NULL);
CREATE INDEX console_session_ends_hash ON console_session_ends(hash);
CREATE TABLE auth_log (slot INTEGER PRIMARY KEY, seq INTEGER NOT NULL, at INTEGER NOT NULL,
  address TEXT NOT NULL, email TEXT NOT NULL);
CREATE TRIGGER user_passwords_no_update BEFORE UPDATE ON user_passwords BEGIN SELECT RAISE(ABORT, 'review store is insert-only: UPDATE on user_passwords rejected'); END;
CREATE TRIGGER user_passwords_no_delete BEFORE DELETE ON user_passwords BEGIN SELECT RAISE(ABORT, 'review store is insert-only: DELETE on user_passwords rejected'); END;
CREATE TRIGGER invites_no_update BEFORE UPDATE ON invites BEGIN SELECT RAISE(ABORT, 'review store is insert-only: UPDATE on invites rejected'); END;
CREATE TRIGGER invites_no_delete BEFORE DELETE ON invites BEGIN SELECT RAISE(ABORT, 'review store is insert-only: DELETE on invites rejected'); END;
CREATE TRIGGER invite_uses_no_update BEFORE UPDATE ON invite_uses BEGIN SELECT RAISE(ABORT, 'review store is insert-only: UPDATE on invite_uses rejected'); END;
CREATE TRIGGER invite_uses_no_delete BEFORE DELETE ON invite_uses BEGIN SELECT RAISE(ABORT, 'review store is insert-only: DELETE on invite_uses rejected'); END;
CREATE TRIGGER console_sessions_no_update BEFORE UPDATE ON console_sessions BEGIN SELECT RAISE(ABORT, 'review store is insert-only: UPDATE on console_sessions rejected'); END;
CREATE TRIGGER console_sessions_no_delete BEFORE DELETE ON console_sessions BEGIN SELECT RAISE(ABORT, 'review store is insert-only: DELETE on console_sessions rejected'); END;
CREATE TRIGGER console_session_seen_no_update BEFORE UPDATE ON console_session_seen BEGIN SELECT RAISE(ABORT, 'review store is insert-only: UPDATE on console_session_seen rejected'); END;
CREATE TRIGGER console_session_seen_no_delete BEFORE DELETE ON console_session_seen BEGIN SELECT RAISE(ABORT, 'review store is insert-only: DELETE on console_session_seen rejected'); END;
CREATE TRIGGER console_session_ends_no_update BEFORE UPDATE ON console_session_ends BEGIN SELECT RAISE(ABORT, 'review store is insert-only: UPDATE on console_session_ends rejected'); END;
CREATE TRIGGER console_session_ends_no_delete BEFORE DELETE ON console_session_ends BEGIN SELECT RAISE(ABORT, 'review store is insert-only: DELETE on console_session_ends rejected'); END;
CREATE TRIGGER auth_log_no_delete BEFORE DELETE ON auth_log BEGIN SELECT RAISE(ABORT, 'auth_log is a ring: rows are overwritten, never deleted'); END;
