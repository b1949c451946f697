-- PostgreSQL review store, migration 12: the review log (docs/evidence.md), an RFC 9162
-- Merkle tree over every stored event, kept beside the events. Insert-only like every other
-- table; the runtime role inserts and reads these tables (docs/review.md "Grants").
--
-- * `log_leaves`: one row per leaf, `idx` gapless from 0 in the order the sequencer (the one
--   instance holding its advisory lock) appended the events. The leaf's preimage fields as
--   hashed: `received_at` is the event's database-clock `received_at` in microseconds
--   (bigint, so the stored value is exactly the one hashed), `payload_sha256` the SHA-256 of
--   the stored payload text. An event has at most one leaf (`event_pk` unique; no foreign key:
--   `events` is keyed by (pk, received_at), and a leaf whose event row is gone must stay, as
--   the evidence of its removal).
-- * `log_tiers`: the hashes of complete subtrees of height 8·level (level ≥ 1), one per 256
--   hashes of the tier below (C2SP tlog-tiles); tier 0 is `log_leaves.leaf_hash`.
-- * `log_checkpoints`: the signed checkpoints (the whole signed note); `signed_at` is the
--   signer's clock in microseconds (the note's own `time` line, so not the database's).
-- * `log_cosigners`: a cosigner's verifier key belongs to the first user who posted it.
-- * `log_cosignatures`: verified cosignatures; one row per (key, size, root).
--
-- The migration computes no hashes: events stored before it get their leaves from the
-- sequencer's first passes (oldest first).
CREATE TABLE log_leaves (idx bigint PRIMARY KEY CHECK (idx >= 0), event_pk bigint NOT NULL UNIQUE,
  user_id text NOT NULL, source text NOT NULL, id text NOT NULL, received_at bigint NOT NULL,
  payload_sha256 bytea NOT NULL CHECK (octet_length(payload_sha256) = 32),
  leaf_hash bytea NOT NULL CHECK (octet_length(leaf_hash) = 32));
CREATE INDEX log_leaves_user ON log_leaves(user_id, idx);
CREATE TABLE log_tiers (level smallint NOT NULL CHECK (level >= 1), idx bigint NOT NULL CHECK (idx >= 0),
  hash bytea NOT NULL CHECK (octet_length(hash) = 32), PRIMARY KEY (level, idx));
CREATE TABLE log_checkpoints (n bigserial PRIMARY KEY, size bigint NOT NULL CHECK (size >= 0),
  root bytea NOT NULL CHECK (octet_length(root) = 32), note text NOT NULL, signed_at bigint NOT NULL);
CREATE INDEX log_checkpoints_size ON log_checkpoints(size, n);
CREATE TABLE log_cosigners (key text PRIMARY KEY, user_id text NOT NULL REFERENCES users(id));
CREATE TABLE log_cosignatures (n bigserial PRIMARY KEY, key text NOT NULL REFERENCES log_cosigners(key),
  user_id text NOT NULL REFERENCES users(id), size bigint NOT NULL CHECK (size >= 0),
  root bytea NOT NULL CHECK (octet_length(root) = 32), time bigint NOT NULL, line text NOT NULL,
  at bigint NOT NULL, UNIQUE (key, size, root));
CREATE INDEX log_cosignatures_size ON log_cosignatures(size, key);

DO $$
DECLARE t text;
BEGIN
  FOREACH t IN ARRAY ARRAY['log_leaves', 'log_tiers', 'log_checkpoints', 'log_cosigners',
                           'log_cosignatures'] LOOP
    EXECUTE format('CREATE TRIGGER %I BEFORE UPDATE OR DELETE ON %I FOR EACH ROW EXECUTE FUNCTION airlock_insert_only()', t || '_insert_only', t);
    EXECUTE format('CREATE TRIGGER %I BEFORE TRUNCATE ON %I FOR EACH STATEMENT EXECUTE FUNCTION airlock_insert_only()', t || '_no_truncate', t);
    EXECUTE format('REVOKE TRUNCATE, UPDATE, DELETE ON %I FROM PUBLIC', t);
  END LOOP;
END $$;
