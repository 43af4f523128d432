-- Expired keys' tombstones: as in migrations/postgres/0007_key_tombstones.sql.
create table key_tombstones (
    merchant_id     integer not null,
    idempotency_key text not null,
    fingerprint     blob not null,
    charge_id       text not null,
    expires_at      integer not null,
    primary key (merchant_id, idempotency_key)
) without rowid;
create index key_tombstones_expires_at on key_tombstones (expires_at);
