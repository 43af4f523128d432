-- Part 2 of issue 42, before building it: the key record and its charge as one
-- row, on a database `idem migrate` has made (for its merchants, tombstones and
-- outbox). `intents` keeps every index the two tables have; `intents_lean`
-- keeps the primary key, the charge's id, the expiry and one in-flight index
-- (the charge id as the acquirer's reference, `processing` the same as
-- `in_flight`). See README.md.
create table intents (
  merchant_id bigint not null references merchants(id),
  idempotency_key text not null check (length(idempotency_key) between 1 and 255),
  fingerprint bytea not null,
  id text not null unique,
  state text not null default 'in_flight' check (state in ('in_flight', 'completed')),
  locked_until timestamptz,
  attempt bigint not null default 1,
  response_status smallint,
  response_body bytea,
  created_at timestamptz not null default now(),
  expires_at timestamptz not null,
  order_id bigint not null check (order_id > 0),
  amount_cents bigint not null check (amount_cents between 1 and 10000000000),
  currency text not null check (currency ~ '^[A-Z]{3}$'),
  description text,
  status text not null default 'processing'
    check (status in ('processing', 'captured', 'declined', 'failed', 'authorized', 'voided')),
  acquirer_reference text not null unique,
  acquirer_capture_id text,
  decline_reason text,
  updated_at timestamptz not null default now(),
  reconcile_attempts int not null default 0,
  next_reconcile_at timestamptz,
  review_since timestamptz,
  review_reason text,
  traceparent text,
  refunded_cents bigint not null default 0,
  capture_method text,
  captured_cents bigint,
  capture_reserved_cents bigint,
  capture_closed_by text,
  check ((state = 'completed') = (response_status is not null and response_body is not null)),
  primary key (merchant_id, idempotency_key)
);
create index intents_expiry on intents (expires_at) where state = 'completed';
create index intents_in_flight on intents (locked_until) where state = 'in_flight';
create index intents_processing on intents (created_at) where status = 'processing';

create table intents_lean (like intents including defaults including constraints);
alter table intents_lean add primary key (merchant_id, idempotency_key), add unique (id);
create index on intents_lean (expires_at) where state = 'completed';
create index on intents_lean (locked_until) where state = 'in_flight';

insert into merchants (name) values ('bench') on conflict do nothing;

-- Shape (b): key rows written once (merchant, key, the subject), the state,
-- lease and stored answer on the charge's row, with the lean indexes.
create table intents_subject (like intents including defaults including constraints);
alter table intents_subject add primary key (id);
create index on intents_subject (expires_at) where state = 'completed';
create index on intents_subject (locked_until) where state = 'in_flight';
create table intent_keys (
  merchant_id bigint not null references merchants(id),
  idempotency_key text not null check (length(idempotency_key) between 1 and 255),
  charge_id text not null references intents_subject(id),
  primary key (merchant_id, idempotency_key)
);
