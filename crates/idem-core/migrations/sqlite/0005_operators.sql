-- Operating idem: as in migrations/postgres/0008_operators.sql, but for one
-- difference: `merchants.secret_hash` stays. SQLite cannot drop a UNIQUE
-- column, and rebuilding `merchants` without it needs foreign keys off, which
-- cannot be switched inside the transaction sqlx runs a migration in. It
-- keeps the hash of the secret the merchant was created with and nothing
-- reads it: `merchant_secrets` decides who authenticates.

create table merchant_secrets (
    id          integer primary key,
    merchant_id integer not null references merchants (id),
    secret_hash blob not null unique,
    created_at  integer not null,
    expires_at  integer
);
create index merchant_secrets_merchant on merchant_secrets (merchant_id);
insert into merchant_secrets (merchant_id, secret_hash, created_at)
    select id, secret_hash, created_at from merchants;

alter table merchants add column disabled_at integer;

alter table charges add column idempotency_key text;

alter table settings add column merchants_version integer not null default 0;

create table audit_log (
    id      integer primary key,
    at      integer not null,
    actor   text not null check (length(actor) between 1 and 100),
    action  text not null,
    subject text not null,
    reason  text,
    detail  text
);
create index audit_log_subject on audit_log (subject, id);
create trigger audit_log_no_update before update on audit_log
    begin select raise(abort, 'audit_log is append-only: UPDATE refused'); end;
create trigger audit_log_no_delete before delete on audit_log
    begin select raise(abort, 'audit_log is append-only: DELETE refused'); end;

create table admin_tokens (
    id         integer primary key,
    name       text not null check (length(name) between 1 and 100),
    token_hash blob not null unique,
    created_at integer not null
);
