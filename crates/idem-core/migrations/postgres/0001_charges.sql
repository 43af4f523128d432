-- The merchants (tenants), their charges, and the idempotency records that
-- guard them. See crates/idem/src/store/mod.rs for the invariants.

create table merchants (
    id          bigint generated always as identity primary key,
    name        text not null unique check (length(name) between 1 and 100),
    -- SHA-256 of the bearer secret; the secret itself is never stored.
    secret_hash bytea not null unique,
    created_at  timestamptz not null default now()
);

-- A charge is permanent: key expiry never deletes one.
create table charges (
    id                 text primary key,
    merchant_id        bigint not null references merchants (id),
    order_id           bigint not null check (order_id > 0),
    amount_cents       bigint not null check (amount_cents between 1 and 10000000000),
    currency           text not null check (currency ~ '^[A-Z]{3}$'),
    description        text,
    status             text not null default 'processing'
                       check (status in ('processing', 'captured', 'declined', 'failed')),
    -- Chosen at claim time and sent unchanged on every call for this charge.
    acquirer_reference text not null unique,
    acquirer_capture_id text,
    decline_reason     text,
    created_at         timestamptz not null default now(),
    updated_at         timestamptz not null default now()
);

-- One row per (merchant, key): the unique constraint that turns two concurrent
-- attempts into one insert and one refusal.
create table idempotency_keys (
    merchant_id     bigint not null references merchants (id),
    idempotency_key text not null check (length(idempotency_key) between 1 and 255),
    -- SHA-256 of the canonical request; a different one under the same key is a 422.
    fingerprint     bytea not null,
    charge_id       text not null references charges (id),
    state           text not null default 'in_flight' check (state in ('in_flight', 'completed')),
    -- The lease of the attempt working on it; past it, another attempt may take over.
    locked_until    timestamptz,
    -- Fencing token: bumped by every take-over; a finalize must present the current one.
    attempt         bigint not null default 1,
    -- The stored outcome, replayed byte for byte.
    response_status smallint,
    response_body   bytea,
    created_at      timestamptz not null default now(),
    -- Completed records are honoured until then; in-flight ones never expire.
    expires_at      timestamptz not null,
    constraint idempotency_keys_pkey primary key (merchant_id, idempotency_key),
    constraint idempotency_keys_completed check (
        (state = 'completed') = (response_status is not null and response_body is not null)
    )
);
