-- Refunds (docs/contract/api.md, "Refunds"): money back from a captured charge,
-- partly or whole, several times, never more in all than the charge captured.
--
-- The sum is the database's to keep: a refund's claim reserves its amount with a
-- guarded update of `charges.refunded_cents` in the claim's own transaction,
-- committed before the acquirer is called; a refund the acquirer refuses gives
-- the amount back in its finalize. The check below holds the line even against
-- a statement that forgot the guard.
--
-- A refund's key record lives in `idempotency_keys` with the charges' (one key
-- space: a key names one operation) and points at its refund, its `charge_id`
-- null. An older binary beside this one joins records to charges by
-- `charge_id`, so it never sees a refund's record: its reconciler cannot take
-- one over as a charge. Only added and relaxed, never removed: expand.
alter table charges
    -- Refunded or reserved by refunds not refused: pending and succeeded.
    add column refunded_cents bigint not null default 0,
    add constraint charges_refunded_within_amount
        check (refunded_cents between 0 and amount_cents);

create table refunds (
    id                 text primary key,
    charge_id          text not null references charges (id),
    merchant_id        bigint not null references merchants (id),
    amount_cents       bigint not null check (amount_cents between 1 and 10000000000),
    currency           text not null check (currency ~ '^[A-Z]{3}$'),
    reason             text check (reason in
                           ('requested_by_customer', 'duplicate', 'fraudulent', 'other')),
    description        text,
    status             text not null default 'pending'
                       check (status in ('pending', 'succeeded', 'failed')),
    -- Derived from the intent as a charge's is, sent unchanged on every call.
    acquirer_reference text not null unique,
    acquirer_refund_id text,
    failure_reason     text,
    idempotency_key    text not null,
    reconcile_attempts integer not null default 0,
    next_reconcile_at  timestamptz,
    review_since       timestamptz,
    review_reason      text,
    traceparent        text,
    created_at         timestamptz not null default now(),
    updated_at         timestamptz not null default now()
);

create index refunds_charge on refunds (charge_id);
create index refunds_pending on refunds (created_at) where status = 'pending';

alter table idempotency_keys
    alter column charge_id drop not null,
    -- Deferred: the claim inserts the key first (the race is the key's), then
    -- the refund it names, in one transaction.
    add column refund_id text references refunds (id) deferrable initially deferred,
    add constraint idempotency_keys_one_subject
        check ((charge_id is null) <> (refund_id is null));

create index idempotency_keys_refund on idempotency_keys (refund_id)
    where refund_id is not null;

alter table key_tombstones
    alter column charge_id drop not null,
    add column refund_id text;
