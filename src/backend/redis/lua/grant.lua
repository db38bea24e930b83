-- Leases quota to one gateway (the script before this one is the body of
-- `decide(cost)`, which may set `left_ms` to the time left in its window).
-- ARGV: limit, window_us, burst (as the algorithm takes them), need, want,
-- holder, lease_ms, back: units of this holder's last lease it did not
-- spend, given back first (smooth buckets only: `decide` of a negative cost).
-- Grants `need` units or none, and up to `want`, but never more than an
-- even share of what is left among the gateways holding leases on the key
-- (`need` excepted): a few gateways cannot strand the quota.
-- Returns {granted, remaining, wait_ms, reset_ms, lease_ms}: on a deny
-- (granted 0) wait_ms is when `need` fits; a lease ends at its window's end.
local need = tonumber(ARGV[4])
local want = tonumber(ARGV[5])
local holder = ARGV[6]
local lease_ms = tonumber(ARGV[7])
local tag = string.match(KEYS[1], '^(.*})')
-- A key blocked through the control handle gets no lease.
local locked = redis.call('PTTL', tag .. ':lock')
if locked > 0 then return {0, 0, locked, locked, 0} end
local holders = tag .. ':holders'
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', holders, '-inf', now_ms)
local back = tonumber(ARGV[8])
if back > 0 then decide(-back) end

local r = decide(need)
if r[1] == 0 then return {0, 0, r[3], r[4], 0} end
local granted = need
local others = redis.call('ZCARD', holders)
if redis.call('ZSCORE', holders, holder) then others = others - 1 end
-- `remaining` counts whole units that still fit now.
local share = math.floor((r[2] + need) / (others + 1))
local extra = math.min(want, share, r[2] + need) - need
if extra > 0 then
  local r2 = decide(extra)
  if r2[1] == 1 then
    granted = granted + extra
    r = r2
  end
end
if left_ms and left_ms < lease_ms then lease_ms = math.max(1, left_ms) end
redis.call('ZADD', holders, now_ms + lease_ms, holder)
if redis.call('PTTL', holders) < lease_ms then redis.call('PEXPIRE', holders, lease_ms) end
return {granted, r[2], r[3], r[4], lease_ms}
