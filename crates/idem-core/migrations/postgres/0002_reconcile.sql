-- Recovery: the reconciler's schedule and review marks on charges, and the
-- indexes the reconciler and the sweeper scan.

alter table charges
    -- Unknown outcomes the reconciler has met for this charge, for its backoff.
    add column reconcile_attempts integer not null default 0,
    -- Not before then does the reconciler try this charge again.
    add column next_reconcile_at timestamptz,
    -- Set when the settle deadline passed without the acquirer's word: a person decides.
    add column review_since timestamptz,
    add column review_reason text;

-- In-flight records by lease end: the reconciler's work list.
create index idempotency_keys_in_flight on idempotency_keys (locked_until)
    where state = 'in_flight';

-- Completed records by expiry: the sweeper's work list.
create index idempotency_keys_expiry on idempotency_keys (expires_at)
    where state = 'completed';
