-- As on PostgreSQL (postgres/0015_delivery_charge.sql): a webhook delivery
-- names the charge its event is about. Only added: expand.
alter table webhook_deliveries add column charge_id text;
create index webhook_deliveries_charge on webhook_deliveries (charge_id)
    where charge_id is not null;
