-- As in migrations/postgres/0010_webhooks.sql. `events` is a JSON array of
-- event names (null: every event); times are integer milliseconds.

create table webhook_endpoints (
    id                    text primary key,
    merchant_id           integer not null references merchants (id),
    url                   text not null,
    events                text,
    secret                text not null,
    previous_secret       text,
    previous_secret_until integer,
    disabled_at           integer,
    created_at            integer not null
);
create index webhook_endpoints_merchant on webhook_endpoints (merchant_id);

create table webhook_deliveries (
    id              integer primary key,
    event_id        text not null,
    endpoint_id     text not null references webhook_endpoints (id) on delete cascade,
    event_type      text not null,
    body            blob not null,
    state           text not null default 'pending'
                    check (state in ('pending', 'delivered', 'failed')),
    attempts        integer not null default 0,
    next_attempt_at integer not null,
    locked_until    integer,
    last_status     integer,
    last_error      text,
    created_at      integer not null,
    finished_at     integer,
    unique (endpoint_id, event_id)
);
create index webhook_deliveries_due on webhook_deliveries (next_attempt_at)
    where state = 'pending';
