-- Embedded review store, migration 5: indexes for listing and exporting events by their own
-- `ts` (`order=ts`, `ts_since`/`ts_until`; keyset pagination on (ts, pk)).
CREATE INDEX events_ts ON events(ts, pk);
CREATE INDEX events_user_ts ON events(user_id, ts, pk);
