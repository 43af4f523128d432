-- A refund's claim and its finalize, each one function called by one
-- statement (crates/idem-core/src/store/postgres/refunds.rs).
--
-- Why. Written as transactions of one-row statements, a refund's claim took
-- seven round trips and its finalize six, each holding the transaction open
-- (and the charge's row locked, for the claim) while the service read one
-- answer and sent the next statement: at 32 clients, 17-19 of the pool's 32
-- connections sat `idle in transaction` and refunds ran at a quarter of new
-- charges' rate (docs/benchmarks.md, "Refunds"). A function runs the same
-- statements in one round trip and one transaction, the charge's row locked
-- only while the server runs them.
--
-- The claim decides as before, in this order: a live tombstone of this very
-- request (a late retry: its refund, nothing claimed); insert first (the key
-- taken: its record is the caller's to read, nothing claimed); else an
-- expired record of another request, locked and made this claim's only
-- once the amount is reserved; the guarded reservation, where the sum rule
-- is the `where` of one update of the charge's row; the refund. A refused
-- reservation leaves nothing: the key this call inserted is deleted in the
-- same transaction (no other transaction ever saw it; a same-key claim
-- waiting on it then inserts its own), an expired record it locked is left
-- as it was.
--
-- An older binary beside this one never calls them: the migration only adds.
create function idem_claim_refund(
    p_merchant_id bigint, p_key text, p_fingerprint bytea, p_refund_id text,
    p_lease_ms bigint, p_key_ttl_ms bigint, p_charge_id text, p_amount bigint,
    p_reason text, p_description text, p_reference text, p_traceparent text
) returns table (
    -- `won`, `taken`, `expired` (a tombstone's: refund_id) or `refused`.
    outcome text,
    refund_id text,
    -- What `won` made: the claim's fencing token, the amount reserved, the
    -- charge's currency and reference, when.
    attempt bigint, amount_cents bigint, currency text, capture_reference text,
    created_at timestamptz,
    -- What `refused` found: the charge as it is (null: no such charge).
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

    -- The whole remainder is read without a lock, then reserved by the
    -- guarded update, which refuses it if another refund took part of it
    -- meanwhile: three rounds at most.
    for round in 1..3 loop
        v_amount := p_amount;
        if v_amount is null then
            select c.amount_cents - c.refunded_cents into v_amount from charges c
             where c.id = p_charge_id and c.merchant_id = p_merchant_id;
            exit when v_amount is null or v_amount <= 0;
        end if;
        update charges c
           set refunded_cents = c.refunded_cents + v_amount, updated_at = now()
         where c.id = p_charge_id and c.merchant_id = p_merchant_id
           and c.status = 'captured' and c.review_since is null
           and c.refunded_cents + v_amount <= c.amount_cents
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
                            c.review_since is not null, c.amount_cents - c.refunded_cents
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
               state = 'in_flight', attempt = v_attempt, response_status = null,
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

-- The outcome, fenced by the attempt, with the refund settled: a refused
-- refund gives its reservation back to the charge; the refund's event (when
-- the deployment has events on) and its webhook deliveries (one for each of
-- the merchant's enabled endpoints that hears it), in the same transaction.
-- Answers whether this attempt still held the record and its outcome is now
-- stored. A refund already settled (by an operator, say) keeps its status
-- and announces nothing more.
create function idem_finalize_refund(
    p_merchant_id bigint, p_key text, p_refund_id text, p_attempt bigint,
    p_response_status smallint, p_response_body bytea, p_key_ttl_ms bigint,
    p_refund_status text, p_acquirer_refund_id text, p_failure_reason text,
    p_event_id text, p_event_exchange text, p_event_type text, p_event_tenant text,
    p_event_body bytea,
    p_webhook_event_id text, p_webhook_event_type text, p_webhook_body bytea
) returns boolean
language plpgsql as $$
declare
    v_charge_id text;
    v_amount bigint;
    v_traceparent text;
begin
    update idempotency_keys k
       set state = 'completed', locked_until = null,
           response_status = p_response_status, response_body = p_response_body,
           expires_at = now() + p_key_ttl_ms * interval '1 millisecond'
     where k.merchant_id = p_merchant_id and k.idempotency_key = p_key
       and k.refund_id = p_refund_id and k.attempt = p_attempt and k.state <> 'completed';
    if not found then
        return false;
    end if;
    update refunds r
       set status = p_refund_status, acquirer_refund_id = p_acquirer_refund_id,
           failure_reason = p_failure_reason, updated_at = now()
     where r.id = p_refund_id and r.status = 'pending'
    returning r.charge_id, r.amount_cents, r.traceparent
         into v_charge_id, v_amount, v_traceparent;
    if not found then
        return true;
    end if;
    if p_refund_status = 'failed' then
        update charges c
           set refunded_cents = c.refunded_cents - v_amount, updated_at = now()
         where c.id = v_charge_id;
    end if;
    if p_event_id is not null and (select s.events_enabled from settings s) then
        insert into outbox
            (kind, message_id, exchange, routing_key, tenant, event_type, body, traceparent)
        values ('event', p_event_id, p_event_exchange, p_event_type, p_event_tenant,
                p_event_type, p_event_body, v_traceparent);
    end if;
    if p_webhook_event_id is not null then
        insert into webhook_deliveries (event_id, endpoint_id, event_type, body)
        select p_webhook_event_id, we.id, p_webhook_event_type, p_webhook_body
          from webhook_endpoints we
         where we.merchant_id = p_merchant_id and we.disabled_at is null
           and (we.events is null or p_webhook_event_type = any(we.events));
    end if;
    return true;
end
$$;
