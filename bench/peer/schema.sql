-- The peer's one table (bench/peer/app inserts a row per charge). No UNIQUE on
-- idem_key, on purpose: a key charged twice shows up as two rows.
CREATE TABLE IF NOT EXISTS charges (
  id         bigserial PRIMARY KEY,
  idem_key   text,
  amount     bigint NOT NULL,
  currency   text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now()
);
