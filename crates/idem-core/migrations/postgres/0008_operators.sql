-- Operating idem: secrets that can be rotated, merchants that can be
-- disabled, and the audit trail of what operators did (docs/operations.md).

-- A merchant's secrets: one, or more during a rotation's grace.
create table merchant_secrets (
    id          bigint generated always as identity primary key,
    merchant_id bigint not null references merchants (id),
    -- SHA-256 of the bearer secret; the secret itself is never stored.
    secret_hash bytea not null unique,
    created_at  timestamptz not null default now(),
    -- Refused from then on; null until the secret is rotated out.
    expires_at  timestamptz
);
create index merchant_secrets_merchant on merchant_secrets (merchant_id);
insert into merchant_secrets (merchant_id, secret_hash, created_at)
    select id, secret_hash, created_at from merchants;
alter table merchants drop column secret_hash;

-- A disabled merchant's secrets are refused and its queue commands dead-lettered.
alter table merchants add column disabled_at timestamptz;

-- Moved by every change to who may authenticate (rotate, disable, enable):
-- each instance reads it every second and forgets the merchants it cached
-- when it has moved, so a revoked secret stops working everywhere within
-- seconds, without a restart.
alter table settings add column merchants_version bigint not null default 0;

-- The key a charge was claimed under, so an operator's `idem charges show`,
-- `retry` and `resolve` find its record by the primary key. Null for charges
-- claimed before this migration: those are found among the in-flight records.
alter table charges add column idempotency_key text;

-- What was done to merchants and charges, by whom (an operator, or the
-- reconciler), when and why. Rows are only ever added.
create table audit_log (
    id      bigint generated always as identity primary key,
    at      timestamptz not null default now(),
    actor   text not null check (length(actor) between 1 and 100),
    -- tenant.create, tenant.rotate, tenant.disable, tenant.enable,
    -- charge.retry, charge.resolve, charge.reconcile
    action  text not null,
    -- The merchant's name or the charge's id.
    subject text not null,
    reason  text,
    -- What the action did, in words (the new secret's expiry, the outcome).
    detail  text
);
create index audit_log_subject on audit_log (subject, id);

create function audit_log_append_only() returns trigger language plpgsql as $$
begin
    raise exception 'audit_log is append-only: % refused', tg_op;
end
$$;
create trigger audit_log_no_update before update or delete on audit_log
    for each row execute function audit_log_append_only();
create trigger audit_log_no_truncate before truncate on audit_log
    for each statement execute function audit_log_append_only();

-- Tokens for the operator console (`idem admin token`), by hash; the name is
-- the actor the console's actions are audited under.
create table admin_tokens (
    id         bigint generated always as identity primary key,
    name       text not null check (length(name) between 1 and 100),
    token_hash bytea not null unique,
    created_at timestamptz not null default now()
);
