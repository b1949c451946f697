-- PostgreSQL review store, schema version 2: dedup conflicts are evidence (review::dedup).
-- Each dedup key keeps the SHA-256 of its original's payload bytes; a different content
-- resent under a stored (user, source, id) is stored as its own event (`conflict_of` = the
-- original's pk) with a row in `event_conflicts`. Runs in one transaction with its
-- `schema_migrations` row, as the owner.
ALTER TABLE event_keys ADD COLUMN sha256 bytea;
-- The backfill is the only UPDATE the store ever makes: the insert-only trigger is lifted for
-- it and put back in the same transaction. Payloads are stored verbatim, so the hash of the
-- stored text is the hash of the bytes as received.
ALTER TABLE event_keys DISABLE TRIGGER event_keys_insert_only;
UPDATE event_keys k SET sha256 = sha256(convert_to(e.payload, 'UTF8'))
  FROM events e WHERE e.pk = k.pk AND e.received_at = k.received_at;
ALTER TABLE event_keys ENABLE TRIGGER event_keys_insert_only;
ALTER TABLE events ADD COLUMN conflict_of bigint;
CREATE TABLE event_conflicts (user_id text NOT NULL, source text NOT NULL, id text NOT NULL,
  sha256 bytea NOT NULL, pk bigint NOT NULL, received_at timestamptz NOT NULL, original_pk bigint NOT NULL,
  PRIMARY KEY (user_id, source, id, sha256));
CREATE TRIGGER event_conflicts_insert_only BEFORE UPDATE OR DELETE ON event_conflicts FOR EACH ROW EXECUTE FUNCTION airlock_insert_only();
CREATE TRIGGER event_conflicts_no_truncate BEFORE TRUNCATE ON event_conflicts FOR EACH STATEMENT EXECUTE FUNCTION airlock_insert_only();
REVOKE TRUNCATE, UPDATE, DELETE ON event_conflicts FROM PUBLIC;
