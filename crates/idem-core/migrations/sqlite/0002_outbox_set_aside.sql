-- Outbox rows the relay can never publish, set aside with the reason: as in
-- migrations/postgres/0005_outbox_set_aside.sql.

alter table outbox add column set_aside_at integer;
alter table outbox add column set_aside_reason text
    check ((set_aside_at is null) = (set_aside_reason is null));
