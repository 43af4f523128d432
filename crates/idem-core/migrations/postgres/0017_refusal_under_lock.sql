-- A refusal tells the state that refused it.
--
-- Why. A refund's or a step's claim reserves with one guarded update of the
-- charge's row; when the guard refuses, the claim then read the row again to
-- say why (what is left, captures pending, the authorization closed). Under
-- read committed that read is a new snapshot: a step or refund that settled
-- in between showed a state that would have let the request through. A void
-- refused because a capture was pending, read after the capture settled,
-- came back as `422 capture-exceeds-authorization` with 40 cents left
-- (two_step::a_void_and_a_capture_sent_at_once_agree_on_one_order_every_time,
-- once in CI's full run); a refund could be told less is left than it asked
-- for while more was.
--
-- Now a refused reservation locks the charge's row (`for no key update`, the
-- lock the update itself takes, so a foreign key check on the charge is not
-- held up) and is tried once more: under the lock the row cannot change, so
-- it either reserves (what refused it was settled meanwhile: the request
-- goes after it) or is refused by the state it then reports. Nothing else
-- changes; the functions keep their signatures, and an older binary calling
-- them gets answers that agree with the row.

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
    v_locked boolean := false;
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

    -- The whole remainder is read without a lock and reserved by the guarded
    -- update. Refused, the charge's row is locked and the reservation tried
    -- once more: what refuses it then is the state the refusal reports.
    loop
        v_amount := p_amount;
        if v_amount is null then
            select coalesce(c.captured_cents, c.amount_cents) - c.refunded_cents into v_amount
              from charges c
             where c.id = p_charge_id and c.merchant_id = p_merchant_id;
        end if;
        if v_amount > 0 then
            update charges c
               set refunded_cents = c.refunded_cents + v_amount, updated_at = now()
             where c.id = p_charge_id and c.merchant_id = p_merchant_id
               and c.status in ('captured', 'authorized') and c.review_since is null
               and c.refunded_cents + v_amount <= coalesce(c.captured_cents, c.amount_cents)
            returning c.currency, c.acquirer_reference into v_currency, v_capture_reference;
        end if;
        exit when v_currency is not null or v_locked;
        perform from charges c where c.id = p_charge_id and c.merchant_id = p_merchant_id
            for no key update;
        exit when not found;
        v_locked := true;
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

create or replace function idem_claim_step(
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
    v_locked boolean := false;
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

    -- The reservation, by a guarded update. Refused, the charge's row is
    -- locked and the reservation tried once more: what refuses it then is the
    -- state the refusal reports.
    loop
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
            -- The whole remainder is read without a lock.
            v_amount := p_amount;
            if v_amount is null then
                select c.amount_cents - c.capture_reserved_cents into v_amount from charges c
                 where c.id = p_charge_id and c.merchant_id = p_merchant_id;
            end if;
            if v_amount > 0 then
                update charges c
                   set capture_reserved_cents = c.capture_reserved_cents + v_amount,
                       capture_closed_by = case when p_final then p_step_id end,
                       updated_at = now()
                 where c.id = p_charge_id and c.merchant_id = p_merchant_id
                   and c.status = 'authorized' and c.review_since is null
                   and c.capture_closed_by is null
                   and c.capture_reserved_cents + v_amount <= c.amount_cents
                returning c.currency, c.acquirer_reference into v_currency, v_reference;
            end if;
        end if;
        exit when v_currency is not null or v_locked;
        perform from charges c where c.id = p_charge_id and c.merchant_id = p_merchant_id
            for no key update;
        exit when not found;
        v_locked := true;
    end loop;

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
