-- The embedded store: the tables of migrations/postgres (0001-0004) in SQLite's
-- dialect, with the same constraints, so the same invariants hold (see
-- crates/idem/src/store/mod.rs).
--
-- Differences, and why:
-- - Times are integer milliseconds since the Unix epoch, UTC, from the host's
--   clock: every process sharing one SQLite file runs on one host, so that clock
--   is the one they all share (PostgreSQL's `now()` plays that part there).
-- - The key record's reference to its charge is deferred: a claim inserts the
--   record first (the insert that decides the race) and its charge second, in
--   one transaction.
-- - The outbox has a lease (`claimed_until`) instead of `for update skip
--   locked`: SQLite has no row locks, and a relay must not hold the database's
--   one write lock while the broker confirms a batch.

create table merchants (
    id          integer primary key,
    name        text not null unique check (length(name) between 1 and 100),
    -- SHA-256 of the bearer secret; the secret itself is never stored.
    secret_hash blob not null unique,
    created_at  integer not null
);

-- A charge is permanent: key expiry never deletes one.
create table charges (
    id                  text primary key,
    merchant_id         integer not null references merchants (id),
    order_id            integer not null check (order_id > 0),
    amount_cents        integer not null check (amount_cents between 1 and 10000000000),
    currency            text not null
                        check (length(currency) = 3 and currency not glob '*[^A-Z]*'),
    description         text,
    status              text not null default 'processing'
                        check (status in ('processing', 'captured', 'declined', 'failed')),
    -- Chosen at claim time and sent unchanged on every call for this charge.
    acquirer_reference  text not null unique,
    acquirer_capture_id text,
    decline_reason      text,
    created_at          integer not null,
    updated_at          integer not null,
    -- Unknown outcomes the reconciler has met for this charge, for its backoff.
    reconcile_attempts  integer not null default 0,
    -- Not before then does the reconciler try this charge again.
    next_reconcile_at   integer,
    -- Set when the settle deadline passed without the acquirer's word: a person decides.
    review_since        integer,
    review_reason       text
);

-- One row per (merchant, key): the unique constraint that turns two concurrent
-- attempts into one insert and one refusal.
create table idempotency_keys (
    merchant_id     integer not null references merchants (id),
    idempotency_key text not null check (length(idempotency_key) between 1 and 255),
    -- SHA-256 of the canonical request; a different one under the same key is a 422.
    fingerprint     blob not null,
    charge_id       text not null references charges (id) deferrable initially deferred,
    state           text not null default 'in_flight' check (state in ('in_flight', 'completed')),
    -- The lease of the attempt working on it; past it, another attempt may take over.
    locked_until    integer,
    -- Fencing token: bumped by every take-over; a finalize must present the current one.
    attempt         integer not null default 1,
    -- The stored outcome, replayed byte for byte.
    response_status integer,
    response_body   blob,
    created_at      integer not null,
    -- Completed records are honoured until then; in-flight ones never expire.
    expires_at      integer not null,
    constraint idempotency_keys_pkey primary key (merchant_id, idempotency_key),
    constraint idempotency_keys_completed check (
        (state = 'completed') = (response_status is not null and response_body is not null)
    )
);

-- In-flight records by lease end: the reconciler's work list.
create index idempotency_keys_in_flight on idempotency_keys (locked_until)
    where state = 'in_flight';

-- Completed records by expiry: the sweeper's work list.
create index idempotency_keys_expiry on idempotency_keys (expires_at)
    where state = 'completed';

-- Unsettled charges by age, for the /metrics gauge of the oldest one.
create index charges_processing on charges (created_at) where status = 'processing';

-- The transactional outbox, as in migrations/postgres/0004_outbox.sql.
create table outbox (
    id                integer primary key autoincrement,
    kind              text not null check (kind in ('event', 'result')),
    message_id        text not null unique,
    exchange          text not null,
    routing_key       text not null,
    tenant            text not null,
    event_type        text,
    correlation_id    text,
    idempotency_key   text,
    replayed          integer,
    status            integer,
    body              blob,
    await_merchant_id integer,
    await_charge_id   text,
    created_at        integer not null,
    -- A relay's lease on the row while the broker confirms it; past it, another
    -- relay may take the row (at-least-once out, as with PostgreSQL).
    claimed_until     integer,
    published_at      integer,
    constraint outbox_event_complete check (
        kind <> 'event' or (event_type is not null and body is not null)
    ),
    constraint outbox_result_source check (
        kind <> 'result' or idempotency_key is not null and replayed is not null
            and ((status is not null and body is not null)
                 or (status is null and body is null
                     and await_merchant_id is not null and await_charge_id is not null))
    )
);

-- The relay's work list, oldest first.
create index outbox_unpublished on outbox (id) where published_at is null;

-- The pruner's work list.
create index outbox_published on outbox (published_at) where published_at is not null;
