-- Outbox rows the relay can never publish: a routing key (a merchant's name,
-- for a result sent to idem.results) or another AMQP short string over 255
-- bytes, which the client library refuses before anything is sent. Merchant
-- names are slugs of at most 100 bytes now, but names stored before that rule
-- are not checked (a constraint would fail this migration on them), so the
-- relay sets such a row aside instead: it stays unpublished, with the reason,
-- out of every later batch and out of the backlog gauges, and is never pruned,
-- so an operator can find it (see docs/queue.md) and the rows behind it go out.

alter table outbox
    add column set_aside_at     timestamptz,
    add column set_aside_reason text,
    add constraint outbox_set_aside_reason
        check ((set_aside_at is null) = (set_aside_reason is null));
