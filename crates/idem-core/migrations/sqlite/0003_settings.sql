-- Settings of the whole deployment: as in migrations/postgres/0006_settings.sql.
create table settings (
    singleton      integer primary key default 1 check (singleton = 1),
    events_enabled integer not null default 0 check (events_enabled in (0, 1)),
    updated_at     integer not null default 0
);
insert into settings default values;
