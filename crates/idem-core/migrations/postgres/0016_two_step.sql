-- Two-step payments (docs/contract/api.md, "Authorize now, capture later"):
-- a charge made with `"capture": false` is `authorized`, and its amount is
-- then captured in one or more steps, or released by a void.
--
-- A step (a capture, or a void) is an operation on the charge as a refund is:
-- its own key record, its own reference at the acquirer, and a reservation
-- against the charge decided by a guarded update of the charge's row in the
-- claim's own transaction, committed before the acquirer is called:
-- * a capture adds its amount to `capture_reserved_cents` only while the sum
--   stays within the authorized `amount_cents` and nothing closed the
--   authorization; a final capture also closes it (`capture_closed_by`);
-- * a void closes it, only while no capture is pending (every reserved cent
--   captured), so that a void and a capture racing on one charge are ordered
--   by that row's lock: the second is refused, whichever it is.
-- A step the acquirer refuses gives its reservation back in its finalize.
-- The checks below hold the lines even against a statement that forgot them.
--
-- The step's key record names it in `step_id`. An older binary beside this
-- one joins records to charges by `charge_id` and to refunds by `refund_id`,
-- so it never sees a step's record (its reconciler cannot take one over as a
-- charge or a refund). Only added and relaxed: expand.
alter table charges drop constraint charges_status_check;
alter table charges
    add constraint charges_status_check check (status in
        ('processing', 'captured', 'declined', 'failed', 'authorized', 'voided')),
    -- Null: captured in one step (the charge as it always was); 'manual':
    -- authorized first (`"capture": false`).
    add column capture_method text check (capture_method = 'manual'),
    -- A two-step charge's captures: succeeded (what refunds may give back),
    -- and succeeded or pending (the sum rule's). Null for a one-step charge.
    add column captured_cents bigint,
    add column capture_reserved_cents bigint,
    -- The final capture or the void, pending or made, that closed the
    -- authorization: no capture after it.
    add column capture_closed_by text,
    add constraint charges_captures_within_authorization check (
        (capture_method is null) = (capture_reserved_cents is null)
        and (capture_method is null) = (captured_cents is null)
        and captured_cents between 0 and capture_reserved_cents
        and capture_reserved_cents <= amount_cents),
    add constraint charges_refunded_within_captured
        check (refunded_cents <= coalesce(captured_cents, amount_cents));

-- The workers' expiry of authorizations not captured in time.
create index charges_authorized on charges (created_at) where status = 'authorized';

create table authorization_steps (
    id                 text primary key,
    kind               text not null check (kind in ('capture', 'void')),
    charge_id          text not null references charges (id),
    merchant_id        bigint not null references merchants (id),
    -- A capture's amount; a void's, what it releases.
    amount_cents       bigint not null check (amount_cents between 1 and 10000000000),
    currency           text not null check (currency ~ '^[A-Z]{3}$'),
    -- A capture that closes the authorization (a void always does).
    final              boolean not null,
    status             text not null default 'pending'
                       check (status in ('pending', 'succeeded', 'failed')),
    acquirer_reference text not null unique,
    acquirer_id        text,
    failure_reason     text,
    idempotency_key    text not null,
    reconcile_attempts integer not null default 0,
    next_reconcile_at  timestamptz,
    review_since       timestamptz,
    review_reason      text,
    traceparent        text,
    created_at         timestamptz not null default now(),
    updated_at         timestamptz not null default now(),
    check (kind = 'capture' or final)
);

create index authorization_steps_charge on authorization_steps (charge_id);
create index authorization_steps_pending on authorization_steps (created_at)
    where status = 'pending';

alter table idempotency_keys
    drop constraint idempotency_keys_one_subject,
    add column step_id text references authorization_steps (id) deferrable initially deferred,
    add constraint idempotency_keys_one_subject
        check (num_nonnulls(charge_id, refund_id, step_id) = 1);

create index idempotency_keys_step on idempotency_keys (step_id) where step_id is not null;

alter table key_tombstones add column step_id text;

-- The refund's claim (migration 0014) with the sum rule of a two-step charge:
-- what it may give back is what was captured (`captured_cents`, null for a
-- one-step charge: its amount), and an authorization partly captured may be
-- refunded as a captured charge. An older binary calling it gets the same
-- rule.
create or replace function idem_claim_refund(
    p_merchant_id bigint, p_key text, p_fingerprint bytea, p_refund_id text,
    p_lease_ms bigint, p_key_ttl_ms bigint, p_charge_id text, p_amount bigint,
    p_reason text, p_description text, p_reference text, p_traceparent text
) returns table (
    outcome text,
    refund_id text,
    attempt bigint, amount_cents bigint, currency text, capture_reference text,
    created_at timestamptz,
    charge_status text, under_review boolean, remaining bigint
)
language plpgsql as $$
#variable_conflict use_column
declare
    v_fresh boolean;
    v_attempt bigint;
    v_amount bigint;
    v_currency text;
    v_capture_reference text;
    v_created_at timestamptz;
    v_tombstone text;
begin
    select t.refund_id into v_tombstone from key_tombstones t
     where t.merchant_id = p_merchant_id and t.idempotency_key = p_key
       and t.fingerprint = p_fingerprint and t.refund_id is not null
       and t.expires_at > now();
    if found then
        return query select 'expired'::text, v_tombstone, null::bigint, null::bigint, null::text,
                            null::text, null::timestamptz, null::text, null::boolean, null::bigint;
        return;
    end if;

    insert into idempotency_keys as k
        (merchant_id, idempotency_key, fingerprint, refund_id, locked_until, expires_at)
    values (p_merchant_id, p_key, p_fingerprint, p_refund_id,
            now() + p_lease_ms * interval '1 millisecond',
            now() + p_key_ttl_ms * interval '1 millisecond')
    on conflict (merchant_id, idempotency_key) do nothing
    returning k.attempt into v_attempt;
    v_fresh := found;
    if not v_fresh then
        select k.attempt + 1 into v_attempt from idempotency_keys k
         where k.merchant_id = p_merchant_id and k.idempotency_key = p_key
           and k.state = 'completed' and k.expires_at <= now() and k.fingerprint <> p_fingerprint
           for update;
        if not found then
            return query select 'taken'::text, null::text, null::bigint, null::bigint, null::text,
                                null::text, null::timestamptz, null::text, null::boolean,
                                null::bigint;
            return;
        end if;
    end if;

    for round in 1..3 loop
        v_amount := p_amount;
        if v_amount is null then
            select coalesce(c.captured_cents, c.amount_cents) - c.refunded_cents into v_amount
              from charges c
             where c.id = p_charge_id and c.merchant_id = p_merchant_id;
            exit when v_amount is null or v_amount <= 0;
        end if;
        update charges c
           set refunded_cents = c.refunded_cents + v_amount, updated_at = now()
         where c.id = p_charge_id and c.merchant_id = p_merchant_id
           and c.status in ('captured', 'authorized') and c.review_since is null
           and c.refunded_cents + v_amount <= coalesce(c.captured_cents, c.amount_cents)
        returning c.currency, c.acquirer_reference into v_currency, v_capture_reference;
        exit when found or p_amount is not null;
    end loop;

    if v_currency is null then
        if v_fresh then
            delete from idempotency_keys k
             where k.merchant_id = p_merchant_id and k.idempotency_key = p_key;
        end if;
        return query select 'refused'::text, null::text, null::bigint, null::bigint, null::text,
                            null::text, null::timestamptz, c.status,
                            c.review_since is not null,
                            coalesce(c.captured_cents, c.amount_cents) - c.refunded_cents
                       from charges c
                      where c.id = p_charge_id and c.merchant_id = p_merchant_id;
        if not found then
            return query select 'refused'::text, null::text, null::bigint, null::bigint,
                                null::text, null::text, null::timestamptz, null::text,
                                null::boolean, null::bigint;
        end if;
        return;
    end if;

    if not v_fresh then
        update idempotency_keys k
           set fingerprint = p_fingerprint, refund_id = p_refund_id, charge_id = null,
               step_id = null, state = 'in_flight', attempt = v_attempt, response_status = null,
               response_body = null,
               locked_until = now() + p_lease_ms * interval '1 millisecond',
               expires_at = now() + p_key_ttl_ms * interval '1 millisecond', created_at = now()
         where k.merchant_id = p_merchant_id and k.idempotency_key = p_key;
    end if;

    insert into refunds as r
        (id, charge_id, merchant_id, amount_cents, currency, reason, description,
         acquirer_reference, idempotency_key, traceparent)
    values (p_refund_id, p_charge_id, p_merchant_id, v_amount, v_currency, p_reason,
            p_description, p_reference, p_key, p_traceparent)
    returning r.created_at into v_created_at;

    return query select 'won'::text, p_refund_id, v_attempt, v_amount, v_currency,
                        v_capture_reference, v_created_at, null::text, null::boolean,
                        null::bigint;
end
$$;

-- A step's claim, as the refund's: a live tombstone of this very request (a
-- late retry: its step, nothing claimed); insert first (the key taken: its
-- record is the caller's to read, nothing claimed); else an expired record of
-- another request, locked and made this claim's only once the reservation
-- holds; the guarded reservation (the `where` of one update of the charge's
-- row); the step. A refused reservation leaves nothing behind.
create function idem_claim_step(
    p_merchant_id bigint, p_key text, p_fingerprint bytea, p_step_id text, p_kind text,
    p_lease_ms bigint, p_key_ttl_ms bigint, p_charge_id text, p_amount bigint,
    p_final boolean, p_reference text, p_traceparent text
) returns table (
    -- `won`, `taken`, `expired` (a tombstone's: step_id) or `refused`.
    outcome text,
    step_id text,
    -- What `won` made: the fencing token, the amount reserved (a void's: what
    -- it releases), the charge's currency and reference, when.
    attempt bigint, amount_cents bigint, currency text, authorization_reference text,
    created_at timestamptz,
    -- What `refused` found: the charge as it is (null: no such charge).
    charge_status text, under_review boolean, remaining bigint, closed boolean,
    capturing boolean
)
language plpgsql as $$
#variable_conflict use_column
declare
    v_fresh boolean;
    v_attempt bigint;
    v_amount bigint;
    v_currency text;
    v_reference text;
    v_created_at timestamptz;
    v_tombstone text;
begin
    select t.step_id into v_tombstone from key_tombstones t
     where t.merchant_id = p_merchant_id and t.idempotency_key = p_key
       and t.fingerprint = p_fingerprint and t.step_id is not null
       and t.expires_at > now();
    if found then
        return query select 'expired'::text, v_tombstone, null::bigint, null::bigint, null::text,
                            null::text, null::timestamptz, null::text, null::boolean,
                            null::bigint, null::boolean, null::boolean;
        return;
    end if;

    insert into idempotency_keys as k
        (merchant_id, idempotency_key, fingerprint, step_id, locked_until, expires_at)
    values (p_merchant_id, p_key, p_fingerprint, p_step_id,
            now() + p_lease_ms * interval '1 millisecond',
            now() + p_key_ttl_ms * interval '1 millisecond')
    on conflict (merchant_id, idempotency_key) do nothing
    returning k.attempt into v_attempt;
    v_fresh := found;
    if not v_fresh then
        select k.attempt + 1 into v_attempt from idempotency_keys k
         where k.merchant_id = p_merchant_id and k.idempotency_key = p_key
           and k.state = 'completed' and k.expires_at <= now() and k.fingerprint <> p_fingerprint
           for update;
        if not found then
            return query select 'taken'::text, null::text, null::bigint, null::bigint,
                                null::text, null::text, null::timestamptz, null::text,
                                null::boolean, null::bigint, null::boolean, null::boolean;
            return;
        end if;
    end if;

    if p_kind = 'void' then
        -- Closes the authorization, releasing what was not captured, only
        -- while no capture is pending.
        update charges c
           set capture_closed_by = p_step_id, updated_at = now()
         where c.id = p_charge_id and c.merchant_id = p_merchant_id
           and c.status = 'authorized' and c.review_since is null
           and c.capture_closed_by is null and c.capture_reserved_cents = c.captured_cents
        returning c.currency, c.acquirer_reference, c.amount_cents - c.captured_cents
             into v_currency, v_reference, v_amount;
    else
        -- The whole remainder is read without a lock, then reserved by the
        -- guarded update, which refuses it if another capture took part of
        -- it meanwhile: three rounds at most.
        for round in 1..3 loop
            v_amount := p_amount;
            if v_amount is null then
                select c.amount_cents - c.capture_reserved_cents into v_amount from charges c
                 where c.id = p_charge_id and c.merchant_id = p_merchant_id;
                exit when v_amount is null or v_amount <= 0;
            end if;
            update charges c
               set capture_reserved_cents = c.capture_reserved_cents + v_amount,
                   capture_closed_by = case when p_final then p_step_id end,
                   updated_at = now()
             where c.id = p_charge_id and c.merchant_id = p_merchant_id
               and c.status = 'authorized' and c.review_since is null
               and c.capture_closed_by is null
               and c.capture_reserved_cents + v_amount <= c.amount_cents
            returning c.currency, c.acquirer_reference into v_currency, v_reference;
            exit when found or p_amount is not null;
        end loop;
    end if;

    if v_currency is null then
        if v_fresh then
            delete from idempotency_keys k
             where k.merchant_id = p_merchant_id and k.idempotency_key = p_key;
        end if;
        return query select 'refused'::text, null::text, null::bigint, null::bigint, null::text,
                            null::text, null::timestamptz, c.status,
                            c.review_since is not null,
                            c.amount_cents - coalesce(c.capture_reserved_cents, c.amount_cents),
                            c.capture_closed_by is not null,
                            c.capture_reserved_cents <> c.captured_cents
                       from charges c
                      where c.id = p_charge_id and c.merchant_id = p_merchant_id;
        if not found then
            return query select 'refused'::text, null::text, null::bigint, null::bigint,
                                null::text, null::text, null::timestamptz, null::text,
                                null::boolean, null::bigint, null::boolean, null::boolean;
        end if;
        return;
    end if;

    if not v_fresh then
        update idempotency_keys k
           set fingerprint = p_fingerprint, step_id = p_step_id, charge_id = null,
               refund_id = null, state = 'in_flight', attempt = v_attempt,
               response_status = null, response_body = null,
               locked_until = now() + p_lease_ms * interval '1 millisecond',
               expires_at = now() + p_key_ttl_ms * interval '1 millisecond', created_at = now()
         where k.merchant_id = p_merchant_id and k.idempotency_key = p_key;
    end if;

    insert into authorization_steps as s
        (id, kind, charge_id, merchant_id, amount_cents, currency, final, acquirer_reference,
         idempotency_key, traceparent)
    values (p_step_id, p_kind, p_charge_id, p_merchant_id, v_amount, v_currency,
            p_kind = 'void' or p_final, p_reference, p_key, p_traceparent)
    returning s.created_at into v_created_at;

    return query select 'won'::text, p_step_id, v_attempt, v_amount, v_currency, v_reference,
                        v_created_at, null::text, null::boolean, null::bigint, null::boolean,
                        null::boolean;
end
$$;

-- A step's outcome, fenced by the attempt, with the step and its charge
-- settled in the same transaction:
-- * a capture made adds to `captured_cents`; the charge is `captured` once
--   the capture was final or nothing is left to capture;
-- * a void made leaves the charge `voided`, or `captured` if part of it was;
-- * a step refused gives its reservation back (a capture's amount, and the
--   closing of a final capture or a void).
-- Then its event and webhook deliveries, as a refund's. Answers whether this
-- attempt still held the record. A step already settled keeps its status.
create function idem_finalize_step(
    p_merchant_id bigint, p_key text, p_step_id text, p_attempt bigint,
    p_response_status smallint, p_response_body bytea, p_key_ttl_ms bigint,
    p_step_status text, p_acquirer_id text, p_failure_reason text,
    p_event_id text, p_event_exchange text, p_event_type text, p_event_tenant text,
    p_event_body bytea,
    p_webhook_event_id text, p_webhook_event_type text, p_webhook_body bytea
) returns boolean
language plpgsql as $$
declare
    v_kind text;
    v_charge_id text;
    v_amount bigint;
    v_final boolean;
    v_traceparent text;
begin
    update idempotency_keys k
       set state = 'completed', locked_until = null,
           response_status = p_response_status, response_body = p_response_body,
           expires_at = now() + p_key_ttl_ms * interval '1 millisecond'
     where k.merchant_id = p_merchant_id and k.idempotency_key = p_key
       and k.step_id = p_step_id and k.attempt = p_attempt and k.state <> 'completed';
    if not found then
        return false;
    end if;
    update authorization_steps s
       set status = p_step_status, acquirer_id = p_acquirer_id,
           failure_reason = p_failure_reason, updated_at = now()
     where s.id = p_step_id and s.status = 'pending'
    returning s.kind, s.charge_id, s.amount_cents, s.final, s.traceparent
         into v_kind, v_charge_id, v_amount, v_final, v_traceparent;
    if not found then
        return true;
    end if;
    if p_step_status = 'succeeded' and v_kind = 'capture' then
        update charges c
           set captured_cents = c.captured_cents + v_amount,
               status = case when v_final or c.captured_cents + v_amount = c.amount_cents
                             then 'captured' else c.status end,
               updated_at = now()
         where c.id = v_charge_id;
    elsif p_step_status = 'succeeded' then
        update charges c
           set status = case when c.captured_cents > 0 then 'captured' else 'voided' end,
               updated_at = now()
         where c.id = v_charge_id;
    else
        update charges c
           set capture_reserved_cents = c.capture_reserved_cents
                   - case when v_kind = 'capture' then v_amount else 0 end,
               capture_closed_by = case when c.capture_closed_by = p_step_id then null
                                        else c.capture_closed_by end,
               updated_at = now()
         where c.id = v_charge_id;
    end if;
    if p_event_id is not null and (select s.events_enabled from settings s) then
        insert into outbox
            (kind, message_id, exchange, routing_key, tenant, event_type, body, traceparent)
        values ('event', p_event_id, p_event_exchange, p_event_type, p_event_tenant,
                p_event_type, p_event_body, v_traceparent);
    end if;
    if p_webhook_event_id is not null then
        insert into webhook_deliveries (event_id, endpoint_id, event_type, body, charge_id)
        select p_webhook_event_id, we.id, p_webhook_event_type, p_webhook_body, v_charge_id
          from webhook_endpoints we
         where we.merchant_id = p_merchant_id and we.disabled_at is null
           and (we.events is null or p_webhook_event_type = any(we.events));
    end if;
    return true;
end
$$;
