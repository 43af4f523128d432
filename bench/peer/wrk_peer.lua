-- wrk script for the peer (bench/peer/app): POST /charges, the same charge every time.
--   WRK_MODE  unique (default): a new Idempotency-Key per request
--             replay: one Idempotency-Key for every request (the first charges, the rest replay)
--   WRK_RUN   the keys' prefix, new for each wrk run so that no run replays another's keys
-- At the end prints "status_counts: 201=N ..." (wrk itself only counts non-2xx answers).
local mode = os.getenv("WRK_MODE") or "unique"
local run = os.getenv("WRK_RUN") or tostring(os.time())
if mode ~= "unique" and mode ~= "replay" then
  error("WRK_MODE must be unique or replay, not " .. mode)
end

local path = "/charges"
local body = '{"amount":1000,"currency":"usd"}'
local replay_key = "bench-" .. run .. "-replay"

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
  local key = replay_key
  if mode == "unique" then
    key = string.format("bench-%s-%d-%d", run, thread_id, sent)
  end
  return wrk.format("POST", path, {
    ["Content-Type"] = "application/json",
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
