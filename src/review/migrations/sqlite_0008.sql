-- Embedded review store, migration 8: flag assignment (docs/api.md, `POST /api/v1/flags/{id}`
-- with `"action": "assign"`). An assignment is a `flag_states` row (`assignment` = 1) that
-- keeps the flag's state at that moment and names the assigned user (`assignee`; NULL on an
-- assignment row: unassigned). Older rows are state actions (0, NULL). Adding columns fires no
-- UPDATE trigger; the insert-only triggers of `flag_states` cover them.
ALTER TABLE flag_states ADD COLUMN assignment INTEGER NOT NULL DEFAULT 0 CHECK (assignment IN (0, 1));
ALTER TABLE flag_states ADD COLUMN assignee TEXT REFERENCES users(id) CHECK (assignee IS NULL OR assignment = 1);
