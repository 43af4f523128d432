-- The key records by their charge. A claim inserts the key record first and
-- its charge second (0001: the reference is deferred); when the charge comes,
-- SQLite settles the pending reference by looking for key records that point
-- at it, and without this index it read the whole table to find them: every
-- claim read every key record kept (a day's, by default), and new charges/s
-- fell as the table grew (docs/benchmarks.md, issue 25). PostgreSQL checks a
-- reference from the child's side and needs none.
create index idempotency_keys_charge on idempotency_keys (charge_id);
