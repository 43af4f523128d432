-- Refunds: as postgres/0013_refunds.sql says. SQLite cannot relax a column's
-- `not null` in place, so `idempotency_keys` and `key_tombstones` are rebuilt
-- (the documented way: a new table, the rows copied, the old one dropped, the
-- new one renamed, its indexes made again), in the migration's transaction.
alter table charges add column refunded_cents integer not null default 0
    check (refunded_cents between 0 and amount_cents);

create table refunds (
    id                 text primary key,
    charge_id          text not null references charges (id),
    merchant_id        integer not null references merchants (id),
    amount_cents       integer not null check (amount_cents between 1 and 10000000000),
    currency           text not null
                       check (length(currency) = 3 and currency not glob '*[^A-Z]*'),
    reason             text check (reason in
                           ('requested_by_customer', 'duplicate', 'fraudulent', 'other')),
    description        text,
    status             text not null default 'pending'
                       check (status in ('pending', 'succeeded', 'failed')),
    acquirer_reference text not null unique,
    acquirer_refund_id text,
    failure_reason     text,
    idempotency_key    text not null,
    reconcile_attempts integer not null default 0,
    next_reconcile_at  integer,
    review_since       integer,
    review_reason      text,
    traceparent        text,
    created_at         integer not null,
    updated_at         integer not null
);

create index refunds_charge on refunds (charge_id);
create index refunds_pending on refunds (created_at) where status = 'pending';

create table idempotency_keys_new (
    merchant_id     integer not null references merchants (id),
    idempotency_key text not null check (length(idempotency_key) between 1 and 255),
    fingerprint     blob not null,
    charge_id       text references charges (id) deferrable initially deferred,
    state           text not null default 'in_flight' check (state in ('in_flight', 'completed')),
    locked_until    integer,
    attempt         integer not null default 1,
    response_status integer,
    response_body   blob,
    created_at      integer not null,
    expires_at      integer not null,
    refund_id       text references refunds (id) deferrable initially deferred,
    constraint idempotency_keys_pkey primary key (merchant_id, idempotency_key),
    constraint idempotency_keys_completed check (
        (state = 'completed') = (response_status is not null and response_body is not null)
    ),
    constraint idempotency_keys_one_subject check ((charge_id is null) <> (refund_id is null))
);
insert into idempotency_keys_new
    (merchant_id, idempotency_key, fingerprint, charge_id, state, locked_until, attempt,
     response_status, response_body, created_at, expires_at)
select merchant_id, idempotency_key, fingerprint, charge_id, state, locked_until, attempt,
       response_status, response_body, created_at, expires_at
  from idempotency_keys;
drop table idempotency_keys;
alter table idempotency_keys_new rename to idempotency_keys;
create index idempotency_keys_in_flight on idempotency_keys (locked_until)
    where state = 'in_flight';
create index idempotency_keys_expiry on idempotency_keys (expires_at)
    where state = 'completed';
create index idempotency_keys_charge on idempotency_keys (charge_id);
create index idempotency_keys_refund on idempotency_keys (refund_id)
    where refund_id is not null;

create table key_tombstones_new (
    merchant_id     integer not null,
    idempotency_key text not null,
    fingerprint     blob not null,
    charge_id       text,
    expires_at      integer not null,
    refund_id       text,
    primary key (merchant_id, idempotency_key)
) without rowid;
insert into key_tombstones_new (merchant_id, idempotency_key, fingerprint, charge_id, expires_at)
select merchant_id, idempotency_key, fingerprint, charge_id, expires_at from key_tombstones;
drop table key_tombstones;
alter table key_tombstones_new rename to key_tombstones;
create index key_tombstones_expires_at on key_tombstones (expires_at);
