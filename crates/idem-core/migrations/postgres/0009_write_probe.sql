-- One row that readiness rewrites, now and then, only while the database
-- could not take a write (a full disk, a read-only server): the probe that
-- tells an instance the load balancer stopped sending charges to that it
-- can write again. Nothing else reads or writes it.
create table write_probe (
    id        smallint primary key check (id = 1),
    probed_at timestamptz not null
);
