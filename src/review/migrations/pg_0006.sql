-- PostgreSQL review store, migration 6: a conflict's received_at comes from the database clock
-- like an event's (migration 0004 made that rule for `events` and `event_keys`; migration 0002,
-- developed beside it, added `event_conflicts`). DEFAULT now(), and a supplied other value is
-- refused by the same trigger function.
ALTER TABLE event_conflicts ALTER COLUMN received_at SET DEFAULT now();
CREATE TRIGGER event_conflicts_received_now BEFORE INSERT ON event_conflicts FOR EACH ROW
  WHEN (NEW.received_at IS DISTINCT FROM now()) EXECUTE FUNCTION airlock_received_now();
