-- Trace context (docs/operations.md, "Tracing"), kept only when tracing is on:
-- a charge keeps the W3C `traceparent` of the attempt that claimed it, so a
-- later reconciler pass links back to that request; an event in the outbox
-- carries its charge's, as an AMQP header. An older binary beside this one
-- leaves them null: the migration only adds.
alter table charges add column traceparent text;
alter table outbox add column traceparent text;
