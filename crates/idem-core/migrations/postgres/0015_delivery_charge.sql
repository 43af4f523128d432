-- A webhook delivery names the charge its event is about (a refund's event:
-- the refund's charge), so that the console's page of a charge lists its
-- deliveries by one indexed equality (docs/operations.md, "The console").
-- Written by this release's statements; a delivery an older binary writes
-- beside this one has none, and is not on the charge's page (the front
-- page's latest deliveries still show it). Only added: expand.
alter table webhook_deliveries add column charge_id text;
create index webhook_deliveries_charge on webhook_deliveries (charge_id)
    where charge_id is not null;

-- The refund's finalize (migration 0014) as it was, its deliveries naming
-- the refund's charge.
create or replace function idem_finalize_refund(
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
        insert into webhook_deliveries (event_id, endpoint_id, event_type, body, charge_id)
        select p_webhook_event_id, we.id, p_webhook_event_type, p_webhook_body, v_charge_id
          from webhook_endpoints we
         where we.merchant_id = p_merchant_id and we.disabled_at is null
           and (we.events is null or p_webhook_event_type = any(we.events));
    end if;
    return true;
end
$$;
