-- Embedded review store, migration 3: a flag state records whether its actor acted on a flag
-- raised on their own history (the sole reviewer/admin, or an admin override; see
-- src/review/flag_rules.rs). Rows written before this migration were not self-actions by rule
-- of the time (none was refused), so they read as 0. Adding a column fires no UPDATE trigger.
ALTER TABLE flag_states ADD COLUMN self INTEGER NOT NULL DEFAULT 0 CHECK (self IN (0, 1));
