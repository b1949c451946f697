-- Embedded review store, migration 9: action gates on the review plane (docs/gates.md "With a
-- review server", docs/api.md "Gates"). A gate is opened once (`gates`) and decided at most
-- once (`gate_decisions`, keyed by the gate: a second decision cannot be inserted); a gate
-- with no decision is pending until its `deadline` and expired after it. Times are
-- microseconds since the epoch (the server's clock). Insert-only like every other table.
CREATE TABLE gates (n INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,
  user_id TEXT NOT NULL REFERENCES users(id),
  kind TEXT NOT NULL CHECK (kind IN ('egress', 'tool', 'external')),
  session TEXT, repo TEXT, method TEXT, host TEXT, port INTEGER, request TEXT,
  action TEXT NOT NULL, digest TEXT NOT NULL,
  severity TEXT NOT NULL CHECK (severity IN ('low', 'medium', 'high')),
  rule TEXT, layer TEXT, policy TEXT, local_id TEXT, context TEXT,
  self_approve INTEGER NOT NULL CHECK (self_approve IN (0, 1)),
  timeout_ms INTEGER NOT NULL CHECK (timeout_ms BETWEEN 1000 AND 3600000),
  requested_at INTEGER NOT NULL, deadline INTEGER NOT NULL);
CREATE INDEX gates_user ON gates(user_id, deadline);
CREATE INDEX gates_deadline ON gates(deadline);
CREATE TABLE gate_decisions (gate_id TEXT PRIMARY KEY REFERENCES gates(id),
  state TEXT NOT NULL CHECK (state IN ('approved', 'denied', 'abandoned', 'expired')),
  actor TEXT REFERENCES users(id), note TEXT,
  self INTEGER NOT NULL CHECK (self IN (0, 1)), step_up INTEGER NOT NULL CHECK (step_up IN (0, 1)),
  at INTEGER NOT NULL,
  CHECK ((state = 'expired') = (actor IS NULL))) WITHOUT ROWID;
CREATE TRIGGER gates_no_update BEFORE UPDATE ON gates BEGIN SELECT RAISE(ABORT, 'review store is insert-only: UPDATE on gates rejected'); END;
CREATE TRIGGER gates_no_delete BEFORE DELETE ON gates BEGIN SELECT RAISE(ABORT, 'review store is insert-only: DELETE on gates rejected'); END;
CREATE TRIGGER gate_decisions_no_update BEFORE UPDATE ON gate_decisions BEGIN SELECT RAISE(ABORT, 'review store is insert-only: UPDATE on gate_decisions rejected'); END;
CREATE TRIGGER gate_decisions_no_delete BEFORE DELETE ON gate_decisions BEGIN SELECT RAISE(ABORT, 'review store is insert-only: DELETE on gate_decisions rejected'); END;
