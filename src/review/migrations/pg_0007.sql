-- PostgreSQL review store, migration 7: where a published transcript line came from, so it
-- can be matched to its session record (docs/api.md, "Transcript envelopes" and
-- "transcript.file"). Nullable columns without a default rewrite no rows and fire no UPDATE
-- trigger; added on the partitioned parent, so every partition (present and future) has them,
-- and the runtime role's table-level INSERT covers them. `file_offset` because OFFSET is an
-- SQL keyword.
ALTER TABLE events ADD COLUMN airlock_session text;
ALTER TABLE events ADD COLUMN file text;
ALTER TABLE events ADD COLUMN file_offset bigint;
-- The comparison (GET /api/v1/sessions/{session}/transcripts) reads a session's
-- `transcript.file` items and counts its lines per file through this index.
CREATE INDEX events_transcript ON events(user_id, airlock_session, file) WHERE airlock_session IS NOT NULL;
