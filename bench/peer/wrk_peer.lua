-- wrk script for the peer (bench/peer/app): POST /charges, the same charge every time,
-- a new key per request or one key replayed (WRK_MODE, WRK_RUN: wrk_common.lua).
dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "wrk_common.lua")

local body = '{"amount":1000,"currency":"usd"}'

function request()
  return wrk.format("POST", "/charges", {
    ["Content-Type"] = "application/json",
    ["Idempotency-Key"] = next_key(),
  }, body)
end
