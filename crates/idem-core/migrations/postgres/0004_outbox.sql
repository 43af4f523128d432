-- The transactional outbox: messages for RabbitMQ, written in the transaction
-- that decides them and published later, with publisher confirms, by a relay
-- (crates/idem/src/queue/relay.rs). Several relays may run: each takes its
-- batch with `for update skip locked`.
--
-- Two kinds of message share it:
-- - `event`: charge.captured / charge.declined, written by the statement that
--   stores a charge's outcome, whichever way the charge arrived;
-- - `result`: the answer to one delivery of a queue command. Its status and
--   body are either set at once, or left null to be taken from the key's
--   stored outcome once it exists (a command that met an unknown outcome or an
--   attempt in flight: the result goes out when the charge settles).

create table outbox (
    id             bigint generated always as identity primary key,
    kind           text not null check (kind in ('event', 'result')),
    -- The AMQP message_id: unique per message, so subscribers can deduplicate.
    message_id     text not null unique,
    exchange       text not null,
    routing_key    text not null,
    -- The merchant's name (header `tenant`).
    tenant         text not null,
    -- Events: their type, as AMQP `type`.
    event_type     text,
    -- Results: AMQP correlation_id and the headers the contract names.
    correlation_id text,
    idempotency_key text,
    replayed       boolean,
    -- Null for a result that waits for the key's outcome; set for the rest.
    status         smallint,
    body           bytea,
    -- The key record a waiting result takes its outcome from.
    await_merchant_id bigint,
    await_charge_id   text,
    created_at     timestamptz not null default now(),
    published_at   timestamptz,
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
