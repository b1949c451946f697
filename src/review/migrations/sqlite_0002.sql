-- Embedded review store, schema version 2: dedup conflicts are evidence (review::dedup).
-- Each dedup key keeps the SHA-256 of its original's payload bytes; a different content
-- resent under a stored (user, source, id) is stored as its own event (`conflict_of` = the
-- original's pk) with a row in `event_conflicts`. Runs in one transaction with its
-- `schema_migrations` row. `airlock_sha256(text)` is registered by the store on its
-- connection before migrating (SQLite has no built-in SHA-256).
ALTER TABLE event_keys ADD COLUMN sha256 BLOB;
-- The backfill is the only UPDATE the store ever makes: the insert-only trigger is lifted for
-- it and put back in the same transaction.
DROP TRIGGER event_keys_no_update;
UPDATE event_keys SET sha256 = (SELECT airlock_sha256(e.payload) FROM events e WHERE e.pk = event_keys.pk);
CREATE TRIGGER event_keys_no_update BEFORE UPDATE ON event_keys BEGIN SELECT RAISE(ABORT, 'review store is insert-only: UPDATE on event_keys rejected'); END;
ALTER TABLE events ADD COLUMN conflict_of INTEGER;
CREATE TABLE event_conflicts (user_id TEXT NOT NULL, source TEXT NOT NULL, id TEXT NOT NULL,
  sha256 BLOB NOT NULL, pk INTEGER NOT NULL, received_at INTEGER NOT NULL, original_pk INTEGER NOT NULL,
  PRIMARY KEY (user_id, source, id, sha256)) WITHOUT ROWID;
CREATE TRIGGER event_conflicts_no_update BEFORE UPDATE ON event_conflicts BEGIN SELECT RAISE(ABORT, 'review store is insert-only: UPDATE on event_conflicts rejected'); END;
CREATE TRIGGER event_conflicts_no_delete BEFORE DELETE ON event_conflicts BEGIN SELECT RAISE(ABORT, 'review store is insert-only: DELETE on event_conflicts rejected'); END;
