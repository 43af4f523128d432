-- The finalize as one function (crates/idem/src/store/postgres/keys.rs): the
-- one-row path calls it once, a batch once per row in one statement.
--
-- Why a function. A finalize written as one statement over a batch's rows
-- (`update ... from unnest(...)`) is a join the planner is free to plan, and
-- either way it was written, the planner found a bad plan:
-- - through the in-flight partial index: a settled record's entry stays in
--   that index until a vacuum, and a bitmap scan reads every one of them
--   without marking any dead, so each batch read all the records settled
--   since the last vacuum (37.9 M index entries for 23,746 charges in a 15 s
--   bench run; on a large table a vacuum comes after 20 % of it changed);
-- - written so that it cannot use that index, as a hash join over a scan of
--   the table, chosen while the table is small (a fresh deployment) and kept
--   by the connection's plan cache as the table grows.
-- Here each row runs one-row statements whose only way to the record is its
-- primary key: the state test says `<> 'completed'` (the same test under the
-- check constraint), which no partial index's predicate can serve, and an
-- equality on the whole primary key costs less than any scan, even of an
-- empty table. The plans are made once per connection and kept.
--
-- Arguments: the first ten of FinalizeValues::params. Answers whether this
-- attempt still held the record (fenced by `attempt`) and its outcome is now
-- stored, with the charge settled. The statement that calls it writes, for
-- the rows that settled, the charge event and the webhook deliveries, once
-- for the whole batch (keys.rs: FINALIZE_AFTER_ROWS). An older binary beside this
-- one never calls it: the migration only adds.
create function idem_finalize(
    p_merchant_id bigint, p_key text, p_charge_id text, p_attempt bigint,
    p_response_status smallint, p_response_body bytea, p_key_ttl_ms bigint,
    p_charge_status text, p_capture_id text, p_decline_reason text
) returns boolean
language plpgsql as $$
begin
    update idempotency_keys
       set state = 'completed', locked_until = null,
           response_status = p_response_status, response_body = p_response_body,
           expires_at = now() + p_key_ttl_ms * interval '1 millisecond'
     where merchant_id = p_merchant_id and idempotency_key = p_key
       and charge_id = p_charge_id and attempt = p_attempt
       and state <> 'completed';
    if not found then
        return false;
    end if;
    update charges
       set status = p_charge_status, acquirer_capture_id = p_capture_id,
           decline_reason = p_decline_reason, updated_at = now()
     where id = p_charge_id;
    return true;
end
$$;
