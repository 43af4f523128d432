-- wrk script for idem: POST /v1/charges (docs/openapi.json, createCharge).
--   WRK_MODE        unique (default): a new Idempotency-Key and a new order_id per request
--                   replay: one Idempotency-Key and one body for every request
--   WRK_RUN         the keys' prefix, new for each wrk run (both: wrk_common.lua)
--   WRK_ORDER_BASE  the first order_id (default 1000000): unique sends
--                   base + thread * 10000000 + n, replay always sends base; give the
--                   warm-up and the measured run bases far apart on the same database
--   IDEM_SECRET     the tenant's secret (`idem tenant create`), sent as a bearer token
dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "wrk_common.lua")

local base = tonumber(os.getenv("WRK_ORDER_BASE") or "1000000")
local secret = os.getenv("IDEM_SECRET")
if not secret or secret == "" then
  error("IDEM_SECRET is not set")
end
local authorization = "Bearer " .. secret

local function charge(order_id)
  return string.format('{"order_id": %d, "amount_cents": 1000, "currency": "BRL"}', order_id)
end
local replay_body = charge(base)

function request()
  local key = next_key()
  local body = replay_body
  if mode == "unique" then
    body = charge(base + thread_id * 10000000 + sent)
  end
  return wrk.format("POST", "/v1/charges", {
    ["Content-Type"] = "application/json",
    ["Authorization"] = authorization,
    ["Idempotency-Key"] = key,
  }, body)
end
