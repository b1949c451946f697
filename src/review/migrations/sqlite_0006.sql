-- Embedded review store, migration 6: where a published transcript line came from, so it can
-- be matched to its session record (docs/api.md, "Transcript envelopes" and
-- "transcript.file"). Nullable columns: older rows and other sources read NULL; adding a
-- column fires no UPDATE trigger, and the insert-only triggers of `events` cover the new ones.
-- `file_offset` because OFFSET is an SQL keyword.
ALTER TABLE events ADD COLUMN airlock_session TEXT;
ALTER TABLE events ADD COLUMN file TEXT;
ALTER TABLE events ADD COLUMN file_offset INTEGER;
-- The comparison (GET /api/v1/sessions/{session}/transcripts) reads a session's
-- `transcript.file` items and counts its lines per file through this index.
CREATE INDEX events_transcript ON events(user_id, airlock_session, file) WHERE airlock_session IS NOT NULL;
