-- idem's schema on MariaDB (10.10 or later), as one file: the tables the
-- other backends reached over their migrations, written for InnoDB.
--
-- As on SQLite, times are integer milliseconds since the epoch (the
-- backend's NOW: the server's clock, fixed for one statement), and booleans
-- are 0 or 1. Every table is InnoDB (row locks, crash-safe commits) in
-- utf8mb4 with a case- and accent-sensitive collation without padding
-- (uca1400_nopad_as_cs): `Key-A` and `key-a` are two keys, and so are `k`
-- and `k ` (MariaDB's default collation would make each pair one). Keys and
-- ids are visible ASCII, which it compares character for character. Not a
-- `_bin` collation: sqlx reads those columns as bytes, not text.
--
-- What MariaDB lacks is written out where it matters:
-- - no partial indexes: each index the others keep `where state = ...`
--   leads with that column instead;
-- - no deferred foreign keys: a claim writes its key record before its
--   charge (insert first), so the key record's `charge_id` has no foreign
--   key; the claim's one transaction writes both or neither.

create table merchants (
    id          bigint primary key auto_increment,
    name        varchar(100) not null unique check (char_length(name) between 1 and 100),
    -- SHA-256 of the merchant's first secret; the secret itself is never stored.
    secret_hash varbinary(32) not null unique,
    created_at  bigint not null,
    disabled_at bigint
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_uca1400_nopad_as_cs;

create table merchant_secrets (
    id          bigint primary key auto_increment,
    merchant_id bigint not null references merchants (id),
    secret_hash varbinary(32) not null unique,
    created_at  bigint not null,
    expires_at  bigint,
    key merchant_secrets_merchant (merchant_id)
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_uca1400_nopad_as_cs;

create table charges (
    id                     varchar(64) primary key,
    merchant_id            bigint not null references merchants (id),
    order_id               bigint not null check (order_id > 0),
    amount_cents           bigint not null check (amount_cents between 1 and 10000000000),
    currency               char(3) not null check (currency regexp '^[A-Z]{3}$'),
    description            text,
    status                 varchar(16) not null default 'processing'
                           check (status in ('processing', 'captured', 'declined', 'failed',
                                             'authorized', 'voided')),
    -- Chosen at claim time and sent unchanged on every call for this charge.
    acquirer_reference     varchar(128) not null,
    acquirer_capture_id    varchar(255),
    decline_reason         text,
    created_at             bigint not null,
    updated_at             bigint not null,
    -- Unknown outcomes the reconciler has met for this charge, for its backoff.
    reconcile_attempts     bigint not null default 0,
    -- Not before then does the reconciler try this charge again.
    next_reconcile_at      bigint,
    -- Set when the settle deadline passed without the acquirer's word: a person decides.
    review_since           bigint,
    review_reason          text,
    idempotency_key        varchar(255),
    traceparent            varchar(64),
    refunded_cents         bigint not null default 0
                           check (refunded_cents between 0 and amount_cents),
    -- Null: captured in one step; 'manual': authorized first.
    capture_method         varchar(8) check (capture_method = 'manual'),
    -- A two-step charge's captures: succeeded, and succeeded or pending.
    captured_cents         bigint,
    capture_reserved_cents bigint,
    -- The final capture or the void, pending or made, that closed the authorization.
    capture_closed_by      varchar(64),
    constraint charges_acquirer_reference_key unique (acquirer_reference),
    constraint charges_captures_within_authorization check (
        (capture_method is null) = (capture_reserved_cents is null)
        and (capture_method is null) = (captured_cents is null)
        and captured_cents between 0 and capture_reserved_cents
        and capture_reserved_cents <= amount_cents),
    constraint charges_refunded_within_captured
        check (refunded_cents <= coalesce(captured_cents, amount_cents)),
    key charges_merchant (merchant_id, created_at),
    key charges_status (status, created_at),
    key charges_created (created_at)
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_uca1400_nopad_as_cs;

create table refunds (
    id                 varchar(64) primary key,
    charge_id          varchar(64) not null references charges (id),
    merchant_id        bigint not null references merchants (id),
    amount_cents       bigint not null check (amount_cents between 1 and 10000000000),
    currency           char(3) not null check (currency regexp '^[A-Z]{3}$'),
    reason             varchar(32) check (reason in
                           ('requested_by_customer', 'duplicate', 'fraudulent', 'other')),
    description        text,
    status             varchar(16) not null default 'pending'
                       check (status in ('pending', 'succeeded', 'failed')),
    acquirer_reference varchar(128) not null unique,
    acquirer_refund_id varchar(255),
    failure_reason     text,
    idempotency_key    varchar(255) not null,
    reconcile_attempts bigint not null default 0,
    next_reconcile_at  bigint,
    review_since       bigint,
    review_reason      text,
    traceparent        varchar(64),
    created_at         bigint not null,
    updated_at         bigint not null,
    key refunds_charge (charge_id),
    key refunds_status (status, created_at)
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_uca1400_nopad_as_cs;

create table authorization_steps (
    id                 varchar(64) primary key,
    kind               varchar(8) not null check (kind in ('capture', 'void')),
    charge_id          varchar(64) not null references charges (id),
    merchant_id        bigint not null references merchants (id),
    -- A capture's amount; a void's, what it releases.
    amount_cents       bigint not null check (amount_cents between 1 and 10000000000),
    currency           char(3) not null check (currency regexp '^[A-Z]{3}$'),
    -- A capture that closes the authorization (a void always does).
    final              tinyint not null check (final in (0, 1)),
    status             varchar(16) not null default 'pending'
                       check (status in ('pending', 'succeeded', 'failed')),
    acquirer_reference varchar(128) not null unique,
    acquirer_id        varchar(255),
    failure_reason     text,
    idempotency_key    varchar(255) not null,
    reconcile_attempts bigint not null default 0,
    next_reconcile_at  bigint,
    review_since       bigint,
    review_reason      text,
    traceparent        varchar(64),
    created_at         bigint not null,
    updated_at         bigint not null,
    constraint authorization_steps_void_final check (kind = 'capture' or final = 1),
    key authorization_steps_charge (charge_id),
    key authorization_steps_status (status, created_at)
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_uca1400_nopad_as_cs;

create table idempotency_keys (
    merchant_id     bigint not null references merchants (id),
    idempotency_key varchar(255) not null
                    check (char_length(idempotency_key) between 1 and 255),
    -- SHA-256 of the canonical request; a different one under the same key is a 422.
    fingerprint     varbinary(32) not null,
    -- No foreign key (see the head of this file): written before its charge.
    charge_id       varchar(64),
    refund_id       varchar(64) references refunds (id),
    step_id         varchar(64) references authorization_steps (id),
    state           varchar(16) not null default 'in_flight'
                    check (state in ('in_flight', 'completed')),
    -- The lease of the attempt working on it; past it, another attempt may take over.
    locked_until    bigint,
    -- Fencing token: bumped by every take-over; a finalize must present the current one.
    attempt         bigint not null default 1,
    -- The stored outcome, replayed byte for byte.
    response_status smallint,
    response_body   longblob,
    created_at      bigint not null,
    -- Completed records are honoured until then; in-flight ones never expire.
    expires_at      bigint not null,
    primary key (merchant_id, idempotency_key),
    constraint idempotency_keys_completed check (
        (state = 'completed') = (response_status is not null and response_body is not null)),
    constraint idempotency_keys_one_subject check (
        (charge_id is not null) + (refund_id is not null) + (step_id is not null) = 1),
    key idempotency_keys_in_flight (state, locked_until),
    key idempotency_keys_expiry (state, expires_at),
    key idempotency_keys_charge (charge_id)
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_uca1400_nopad_as_cs;

create table key_tombstones (
    merchant_id     bigint not null,
    idempotency_key varchar(255) not null,
    fingerprint     varbinary(32) not null,
    charge_id       varchar(64),
    refund_id       varchar(64),
    step_id         varchar(64),
    expires_at      bigint not null,
    primary key (merchant_id, idempotency_key),
    key key_tombstones_expires_at (expires_at)
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_uca1400_nopad_as_cs;

create table outbox (
    id                bigint primary key auto_increment,
    kind              varchar(8) not null check (kind in ('event', 'result')),
    message_id        varchar(128) not null unique,
    exchange          varchar(255) not null,
    routing_key       varchar(255) not null,
    tenant            varchar(100) not null,
    event_type        varchar(64),
    correlation_id    varchar(255),
    idempotency_key   varchar(255),
    replayed          tinyint,
    status            smallint,
    body              longblob,
    await_merchant_id bigint,
    await_charge_id   varchar(64),
    traceparent       varchar(64),
    created_at        bigint not null,
    -- A relay's lease on the row while the broker confirms it.
    claimed_until     bigint,
    published_at      bigint,
    set_aside_at      bigint,
    set_aside_reason  text,
    constraint outbox_event_complete check (
        kind <> 'event' or (event_type is not null and body is not null)),
    constraint outbox_result_source check (
        kind <> 'result' or idempotency_key is not null and replayed is not null
            and ((status is not null and body is not null)
                 or (status is null and body is null
                     and await_merchant_id is not null and await_charge_id is not null))),
    constraint outbox_set_aside check ((set_aside_at is null) = (set_aside_reason is null)),
    key outbox_unpublished (published_at, id)
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_uca1400_nopad_as_cs;

create table settings (
    singleton         tinyint primary key default 1 check (singleton = 1),
    events_enabled    tinyint not null default 0 check (events_enabled in (0, 1)),
    updated_at        bigint not null default 0,
    merchants_version bigint not null default 0
) engine = InnoDB;

insert into settings () values ();

create table audit_log (
    id      bigint primary key auto_increment,
    at      bigint not null,
    actor   varchar(100) not null check (char_length(actor) between 1 and 100),
    action  varchar(64) not null,
    subject varchar(255) not null,
    reason  text,
    detail  text,
    key audit_log_subject (subject, id)
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_uca1400_nopad_as_cs;

create trigger audit_log_no_update before update on audit_log for each row
    signal sqlstate '45000' set message_text = 'audit_log is append-only: UPDATE refused';

create trigger audit_log_no_delete before delete on audit_log for each row
    signal sqlstate '45000' set message_text = 'audit_log is append-only: DELETE refused';

create table admin_tokens (
    id         bigint primary key auto_increment,
    name       varchar(100) not null check (char_length(name) between 1 and 100),
    token_hash varbinary(32) not null unique,
    created_at bigint not null
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_uca1400_nopad_as_cs;

create table write_probe (
    id        tinyint primary key check (id = 1),
    probed_at bigint not null
) engine = InnoDB;

create table webhook_endpoints (
    id                    varchar(64) primary key,
    merchant_id           bigint not null references merchants (id),
    url                   text not null,
    events                text,
    secret                varchar(255) not null,
    previous_secret       varchar(255),
    previous_secret_until bigint,
    disabled_at           bigint,
    created_at            bigint not null,
    key webhook_endpoints_merchant (merchant_id)
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_uca1400_nopad_as_cs;

create table webhook_deliveries (
    id              bigint primary key auto_increment,
    event_id        varchar(128) not null,
    endpoint_id     varchar(64) not null references webhook_endpoints (id) on delete cascade,
    event_type      varchar(64) not null,
    body            longblob not null,
    state           varchar(16) not null default 'pending'
                    check (state in ('pending', 'delivered', 'failed')),
    attempts        int not null default 0,
    next_attempt_at bigint not null,
    locked_until    bigint,
    last_status     int,
    last_error      text,
    created_at      bigint not null,
    finished_at     bigint,
    charge_id       varchar(64),
    unique (endpoint_id, event_id),
    key webhook_deliveries_due (state, next_attempt_at),
    key webhook_deliveries_charge (charge_id)
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_uca1400_nopad_as_cs;
