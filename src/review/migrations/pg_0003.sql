-- PostgreSQL review store, migration 3: a flag state records whether its actor acted on a flag
-- raised on their own history (the sole reviewer/admin, or an admin override; see
-- src/review/flag_rules.rs). Older rows read as false. A constant default rewrites no rows and
-- fires no UPDATE trigger; the runtime role's table-level INSERT covers the new column.
ALTER TABLE flag_states ADD COLUMN IF NOT EXISTS self boolean NOT NULL DEFAULT false;
