-- Settings of the whole deployment, which every instance reads from here so
-- that all agree. One row.
--
-- events_enabled: whether a finalize writes its charge event to the outbox.
-- Off until a relay is configured (`idem serve --amqp-url`, `idem consume`),
-- which turns it on at start, or `idem events enable`: a deployment without a
-- broker would otherwise fill the outbox with events nothing ever publishes.
create table settings (
    singleton      boolean primary key default true check (singleton),
    events_enabled boolean not null default false,
    updated_at     timestamptz not null default now()
);
insert into settings default values;
