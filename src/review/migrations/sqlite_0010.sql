-- Embedded review store, migration 10: the review log (docs/evidence.md), an RFC 9162 Merkle
-- tree over every stored event, kept beside the events. Insert-only like every other table.
--
-- * `log_leaves`: one row per leaf, `idx` gapless from 0 in the order the log sequenced the
--   events; the leaf's preimage fields as hashed (`received_at` in microseconds, as `events`
--   keeps it; `payload_sha256` of the stored payload text) and its hash. An event has at
--   most one leaf (`event_pk` unique); a leaf whose event row is gone is an orphan.
-- * `log_tiers`: the hashes of complete subtrees of height 8·level (level ≥ 1), one per 256
--   hashes of the tier below (C2SP tlog-tiles); tier 0 is `log_leaves.leaf_hash`.
-- * `log_checkpoints`: the signed checkpoints (the whole signed note); `signed_at` is the
--   signer's clock in microseconds.
-- * `log_cosigners`: a cosigner's verifier key belongs to the first user who posted it.
-- * `log_cosignatures`: verified cosignatures; one row per (key, size, root).
--
-- The migration computes no hashes: events stored before it get their leaves from the
-- sequencer's first pass (oldest first).
CREATE TABLE log_leaves (idx INTEGER PRIMARY KEY CHECK (idx >= 0),
  event_pk INTEGER NOT NULL UNIQUE, user_id TEXT NOT NULL, source TEXT NOT NULL, id TEXT NOT NULL,
  received_at INTEGER NOT NULL,
  payload_sha256 BLOB NOT NULL CHECK (length(payload_sha256) = 32),
  leaf_hash BLOB NOT NULL CHECK (length(leaf_hash) = 32));
CREATE INDEX log_leaves_user ON log_leaves(user_id, idx);
CREATE TABLE log_tiers (level INTEGER NOT NULL CHECK (level >= 1), idx INTEGER NOT NULL CHECK (idx >= 0),
  hash BLOB NOT NULL CHECK (length(hash) = 32), PRIMARY KEY (level, idx)) WITHOUT ROWID;
CREATE TABLE log_checkpoints (n INTEGER PRIMARY KEY AUTOINCREMENT, size INTEGER NOT NULL CHECK (size >= 0),
  root BLOB NOT NULL CHECK (length(root) = 32), note TEXT NOT NULL, signed_at INTEGER NOT NULL);
CREATE INDEX log_checkpoints_size ON log_checkpoints(size, n);
CREATE TABLE log_cosigners (key TEXT PRIMARY KEY, user_id TEXT NOT NULL REFERENCES users(id)) WITHOUT ROWID;
CREATE TABLE log_cosignatures (n INTEGER PRIMARY KEY AUTOINCREMENT,
  key TEXT NOT NULL REFERENCES log_cosigners(key), user_id TEXT NOT NULL REFERENCES users(id),
  size INTEGER NOT NULL CHECK (size >= 0), root BLOB NOT NULL CHECK (length(root) = 32),
  time INTEGER NOT NULL, line TEXT NOT NULL, at INTEGER NOT NULL, UNIQUE (key, size, root));
CREATE INDEX log_cosignatures_size ON log_cosignatures(size, key);
CREATE TRIGGER log_leaves_no_update BEFORE UPDATE ON log_leaves BEGIN SELECT RAISE(ABORT, 'review store is insert-only: UPDATE on log_leaves rejected'); END;
CREATE TRIGGER log_leaves_no_delete BEFORE DELETE ON log_leaves BEGIN SELECT RAISE(ABORT, 'review store is insert-only: DELETE on log_leaves rejected'); END;
CREATE TRIGGER log_tiers_no_update BEFORE UPDATE ON log_tiers BEGIN SELECT RAISE(ABORT, 'review store is insert-only: UPDATE on log_tiers rejected'); END;
CREATE TRIGGER log_tiers_no_delete BEFORE DELETE ON log_tiers BEGIN SELECT RAISE(ABORT, 'review store is insert-only: DELETE on log_tiers rejected'); END;
CREATE TRIGGER log_checkpoints_no_update BEFORE UPDATE ON log_checkpoints BEGIN SELECT RAISE(ABORT, 'review store is insert-only: UPDATE on log_checkpoints rejected'); END;
CREATE TRIGGER log_checkpoints_no_delete BEFORE DELETE ON log_checkpoints BEGIN SELECT RAISE(ABORT, 'review store is insert-only: DELETE on log_checkpoints rejected'); END;
CREATE TRIGGER log_cosigners_no_update BEFORE UPDATE ON log_cosigners BEGIN SELECT RAISE(ABORT, 'review store is insert-only: UPDATE on log_cosigners rejected'); END;
CREATE TRIGGER log_cosigners_no_delete BEFORE DELETE ON log_cosigners BEGIN SELECT RAISE(ABORT, 'review store is insert-only: DELETE on log_cosigners rejected'); END;
CREATE TRIGGER log_cosignatures_no_update BEFORE UPDATE ON log_cosignatures BEGIN SELECT RAISE(ABORT, 'review store is insert-only: UPDATE on log_cosignatures rejected'); END;
CREATE TRIGGER log_cosignatures_no_delete BEFORE DELETE ON log_cosignatures BEGIN SELECT RAISE(ABORT, 'review store is insert-only: DELETE on log_cosignatures rejected'); END;
