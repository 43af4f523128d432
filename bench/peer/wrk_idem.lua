-- wrk script for idem: POST /v1/charges (docs/openapi.json, createCharge).
--   WRK_MODE        unique (default): a new Idempotency-Key and a new order_id per request
--                   replay: one Idempotency-Key and one body for every request
--   WRK_RUN         the keys' prefix, new for each wrk run
--   WRK_ORDER_BASE  the first order_id (default 1000000): unique sends
--                   base + thread * 10000000 + n, replay always sends base; give the
--                   warm-up and the measured run bases far apart on the same database
--   IDEM_SECRET     the tenant's secret (`idem tenant create`), sent as a bearer token
-- At the end prints "status_counts: 201=N ..." (wrk itself only counts non-2xx answers).
local mode = os.getenv("WRK_MODE") or "unique"
local run = os.getenv("WRK_RUN") or tostring(os.time())
local base = tonumber(os.getenv("WRK_ORDER_BASE") or "1000000")
local secret = os.getenv("IDEM_SECRET")
if not secret or secret == "" then
  error("IDEM_SECRET is not set")
end
if mode ~= "unique" and mode ~= "replay" then
  error("WRK_MODE must be unique or replay, not " .. mode)
end

local path = "/v1/charges"
local authorization = "Bearer " .. secret
local replay_key = "bench-" .. run .. "-replay"

local function charge(order_id)
  return string.format('{"order_id": %d, "amount_cents": 1000, "currency": "BRL"}', order_id)
end
local replay_body = charge(base)

local threads = {}
thread_id = 0 -- set per thread by setup()
sent = 0
counts = {}

function setup(thread)
  table.insert(threads, thread)
  thread:set("thread_id", #threads)
end

function request()
  sent = sent + 1
  local key, body = replay_key, replay_body
  if mode == "unique" then
    key = string.format("bench-%s-%d-%d", run, thread_id, sent)
    body = charge(base + thread_id * 10000000 + sent)
  end
  return wrk.format("POST", path, {
    ["Content-Type"] = "application/json",
    ["Authorization"] = authorization,
    ["Idempotency-Key"] = key,
  }, body)
end

function response(status, headers, resp_body)
  counts[status] = (counts[status] or 0) + 1
end

function done(summary, latency, requests)
  local total = {}
  for _, thread in ipairs(threads) do
    for status, n in pairs(thread:get("counts")) do
      total[status] = (total[status] or 0) + n
    end
  end
  local parts = {}
  for status, n in pairs(total) do
    parts[#parts + 1] = string.format("%d=%d", status, n)
  end
  table.sort(parts)
  io.write("status_counts: " .. table.concat(parts, " ") .. "\n")
end
