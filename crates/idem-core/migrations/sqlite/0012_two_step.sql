-- Two-step payments: as postgres/0016_two_step.sql says (a charge made with
-- `"capture": false` is `authorized`, then captured in steps or voided; a
-- step is an operation on the charge as a refund is, with its own key record,
-- its own reference at the acquirer, and a reservation against the charge
-- decided by a guarded update of the charge's row in the claim's own write
-- transaction). The same columns and checks in SQLite's terms: times in
-- integer milliseconds, booleans 0 or 1. The step's key record names it in
-- `step_id`: an older binary joins records to charges by `charge_id` and to
-- refunds by `refund_id`, so it never sees a step's record; the checks hold
-- the lines even against its statements (a refund beyond what a two-step
-- charge captured fails on `charges_refunded_within_captured`). Only added and
-- relaxed: expand.
--
-- SQLite cannot alter a CHECK, and `charges.status` must now allow
-- 'authorized' and 'voided', so `charges` is rebuilt, and `idempotency_keys`
-- for its one-subject check over three columns (as 0010 rebuilt it). sqlx
-- (0.8) runs every SQLite migration inside a transaction of its own, with the
-- row of `_sqlx_migrations` in it, whatever the file's first line says, so
-- `pragma foreign_keys = off` (a no-op inside a transaction) is not to be had.
-- Foreign keys stay on, and the rebuild keeps them whole by being balanced:
-- * `defer_foreign_keys` defers every foreign key check to the commit (and
--   ends with the transaction);
-- * dropping `charges` deletes its rows first, which counts one violation per
--   refund and key record that names one of them;
-- * the new `charges`, made under the same name (no rename: a rename would
--   leave the count as it is), takes every row back, with its rowid, and each
--   row inserted settles the violations of the rows that name it.
-- At the commit, a violation still counted fails it, and the whole migration
-- is rolled back. A crash midway leaves the write-ahead log's uncommitted
-- frames behind, ignored on recovery: the file is as it was, and the
-- migration runs again. Other processes on the file wait for the write lock
-- (or give up after their busy timeout) while it runs, and their readers see
-- the schema from before it until it commits. It writes `charges` twice and
-- `idempotency_keys` once: about 12 s for 500,000 of each (the file grows by
-- the old tables' pages, free for reuse).
pragma defer_foreign_keys = on;

-- The first statement writes: the write lock is taken before anything is
-- read, so no other process's commit can come between.
create table charges_before_0012 as select rowid as old_rowid, * from charges;
drop table charges;
create table charges (
    id                     text primary key,
    merchant_id            integer not null references merchants (id),
    order_id               integer not null check (order_id > 0),
    amount_cents           integer not null check (amount_cents between 1 and 10000000000),
    currency               text not null
                           check (length(currency) = 3 and currency not glob '*[^A-Z]*'),
    description            text,
    status                 text not null default 'processing'
                           constraint charges_status_check check (status in
                               ('processing', 'captured', 'declined', 'failed', 'authorized',
                                'voided')),
    -- Chosen at claim time and sent unchanged on every call for this charge.
    acquirer_reference     text not null unique,
    acquirer_capture_id    text,
    decline_reason         text,
    created_at             integer not null,
    updated_at             integer not null,
    -- Unknown outcomes the reconciler has met for this charge, for its backoff.
    reconcile_attempts     integer not null default 0,
    -- Not before then does the reconciler try this charge again.
    next_reconcile_at      integer,
    -- Set when the settle deadline passed without the acquirer's word: a person decides.
    review_since           integer,
    review_reason          text,
    idempotency_key        text,
    traceparent            text,
    refunded_cents         integer not null default 0
                           check (refunded_cents between 0 and amount_cents),
    -- Null: captured in one step (the charge as it always was); 'manual':
    -- authorized first (`"capture": false`).
    capture_method         text check (capture_method = 'manual'),
    -- A two-step charge's captures: succeeded (what refunds may give back),
    -- and succeeded or pending (the sum rule's). Null for a one-step charge.
    captured_cents         integer,
    capture_reserved_cents integer,
    -- The final capture or the void, pending or made, that closed the
    -- authorization: no capture after it.
    capture_closed_by      text,
    constraint charges_captures_within_authorization check (
        (capture_method is null) = (capture_reserved_cents is null)
        and (capture_method is null) = (captured_cents is null)
        and captured_cents between 0 and capture_reserved_cents
        and capture_reserved_cents <= amount_cents),
    constraint charges_refunded_within_captured
        check (refunded_cents <= coalesce(captured_cents, amount_cents))
);
insert into charges
    (rowid, id, merchant_id, order_id, amount_cents, currency, description, status,
     acquirer_reference, acquirer_capture_id, decline_reason, created_at, updated_at,
     reconcile_attempts, next_reconcile_at, review_since, review_reason, idempotency_key,
     traceparent, refunded_cents)
select old_rowid, id, merchant_id, order_id, amount_cents, currency, description, status,
       acquirer_reference, acquirer_capture_id, decline_reason, created_at, updated_at,
       reconcile_attempts, next_reconcile_at, review_since, review_reason, idempotency_key,
       traceparent, refunded_cents
  from charges_before_0012
 order by old_rowid;
drop table charges_before_0012;

-- The indexes the drop took with it (0001), and the new one: the workers'
-- expiry of authorizations not captured in time.
create index charges_processing on charges (created_at) where status = 'processing';
create index charges_authorized on charges (created_at) where status = 'authorized';

create table authorization_steps (
    id                 text primary key,
    kind               text not null check (kind in ('capture', 'void')),
    charge_id          text not null references charges (id),
    merchant_id        integer not null references merchants (id),
    -- A capture's amount; a void's, what it releases.
    amount_cents       integer not null check (amount_cents between 1 and 10000000000),
    currency           text not null
                       check (length(currency) = 3 and currency not glob '*[^A-Z]*'),
    -- A capture that closes the authorization (a void always does).
    final              integer not null check (final in (0, 1)),
    status             text not null default 'pending'
                       check (status in ('pending', 'succeeded', 'failed')),
    acquirer_reference text not null unique,
    acquirer_id        text,
    failure_reason     text,
    idempotency_key    text not null,
    reconcile_attempts integer not null default 0,
    next_reconcile_at  integer,
    review_since       integer,
    review_reason      text,
    traceparent        text,
    created_at         integer not null,
    updated_at         integer not null,
    check (kind = 'capture' or final = 1)
);

-- By charge: a charge's steps, and the lookup SQLite makes when a charge's
-- row comes while a claim's deferred references are pending (0008).
create index authorization_steps_charge on authorization_steps (charge_id);
create index authorization_steps_pending on authorization_steps (created_at)
    where status = 'pending';

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
    step_id         text references authorization_steps (id) deferrable initially deferred,
    constraint idempotency_keys_pkey primary key (merchant_id, idempotency_key),
    constraint idempotency_keys_completed check (
        (state = 'completed') = (response_status is not null and response_body is not null)
    ),
    constraint idempotency_keys_one_subject check (
        (charge_id is not null) + (refund_id is not null) + (step_id is not null) = 1)
);
insert into idempotency_keys_new
    (rowid, merchant_id, idempotency_key, fingerprint, charge_id, state, locked_until, attempt,
     response_status, response_body, created_at, expires_at, refund_id)
select rowid, merchant_id, idempotency_key, fingerprint, charge_id, state, locked_until, attempt,
       response_status, response_body, created_at, expires_at, refund_id
  from idempotency_keys
 order by rowid;
drop table idempotency_keys;
alter table idempotency_keys_new rename to idempotency_keys;
create index idempotency_keys_in_flight on idempotency_keys (locked_until)
    where state = 'in_flight';
create index idempotency_keys_expiry on idempotency_keys (expires_at)
    where state = 'completed';
create index idempotency_keys_charge on idempotency_keys (charge_id);
create index idempotency_keys_refund on idempotency_keys (refund_id)
    where refund_id is not null;
create index idempotency_keys_step on idempotency_keys (step_id)
    where step_id is not null;

alter table key_tombstones add column step_id text;
