-- What the sweeper leaves of an expired key: enough to know that a late retry
-- of the same request is not a new intent (answered 410 Gone, naming the
-- charge), for --tombstone-ttl after the key expired. A retry with another
-- request under the key is a new intent as before.
create table key_tombstones (
    merchant_id     bigint not null,
    idempotency_key text not null,
    fingerprint     bytea not null,
    charge_id       text not null,
    expires_at      timestamptz not null,
    primary key (merchant_id, idempotency_key)
);
create index key_tombstones_expires_at on key_tombstones (expires_at);
