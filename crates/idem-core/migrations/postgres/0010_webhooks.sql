-- Merchant webhooks (docs/webhooks.md): the endpoints a merchant is told of
-- its charges' outcomes at, and one delivery per event per endpoint.

create table webhook_endpoints (
    id                    text primary key,
    merchant_id           bigint not null references merchants (id),
    url                   text not null,
    -- The events it hears (`charge.captured`, ...); null: every event.
    events                text[],
    -- The signing secret (`whsec_...`). Signing needs the secret itself, so
    -- it is stored as it is: who reads this table can sign as idem.
    secret                text not null,
    -- During a rotation's grace, the secret before, which signs too until then.
    previous_secret       text,
    previous_secret_until timestamptz,
    disabled_at           timestamptz,
    created_at            timestamptz not null default now()
);
create index webhook_endpoints_merchant on webhook_endpoints (merchant_id);

-- One event for one endpoint, written in the transaction that decides the
-- outcome, sent by whichever deliverer leases it, retried with backoff until
-- the endpoint answers 2xx (`delivered`) or the schedule ends (`failed`).
create table webhook_deliveries (
    id              bigint generated always as identity primary key,
    -- The event's id: the `webhook-id` of every attempt.
    event_id        text not null,
    endpoint_id     text not null references webhook_endpoints (id) on delete cascade,
    event_type      text not null,
    body            bytea not null,
    state           text not null default 'pending'
                    check (state in ('pending', 'delivered', 'failed')),
    attempts        integer not null default 0,
    next_attempt_at timestamptz not null default now(),
    -- Held by a deliverer until then; another takes it after.
    locked_until    timestamptz,
    last_status     smallint,
    last_error      text,
    created_at      timestamptz not null default now(),
    finished_at     timestamptz,
    unique (endpoint_id, event_id)
);
create index webhook_deliveries_due on webhook_deliveries (next_attempt_at)
    where state = 'pending';
