-- As in migrations/postgres/0009_write_probe.sql: the one row readiness
-- rewrites while the file could not take a write (a full disk, a read-only
-- file system), to learn that it can again.
create table write_probe (
    id        integer primary key check (id = 1),
    probed_at integer not null
);
