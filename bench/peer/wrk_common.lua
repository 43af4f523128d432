-- What wrk_idem.lua and wrk_peer.lua share, loaded by each (wrk runs a script
-- per thread, and setup/response/done must be globals):
--   WRK_MODE  unique (default): a new Idempotency-Key per request
--             replay: one Idempotency-Key for every request
--   WRK_RUN   the keys' prefix, new for each wrk run so that no run replays another's keys
-- and the answers counted by status, printed at the end as "status_counts: 201=N ..."
-- (wrk itself only counts non-2xx answers).
mode = os.getenv("WRK_MODE") or "unique"
run = os.getenv("WRK_RUN") or tostring(os.time())
if mode ~= "unique" and mode ~= "replay" then
  error("WRK_MODE must be unique or replay, not " .. mode)
end

local threads = {}
thread_id = 0 -- set per thread by setup()
sent = 0 -- this thread's requests so far
counts = {}

function setup(thread)
  table.insert(threads, thread)
  thread:set("thread_id", #threads)
end

-- The key of this thread's next request (counted in `sent`).
function next_key()
  sent = sent + 1
  if mode == "unique" then
    return string.format("bench-%s-%d-%d", run, thread_id, sent)
  end
  return "bench-" .. run .. "-replay"
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
