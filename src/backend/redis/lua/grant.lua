-- Leases quota to one gateway (clock.lua and an algorithm's
-- `decide(key, cost, of_window)` and moved.lua come first; a window's
-- `decide` returns the time left in its window and the window's name after
-- its decision).
-- ARGV: limit, window_us, burst (as the algorithm takes them), need, want,
-- holder, lease_ms, back: units of this holder's last lease it did not
-- spend, given back first (`decide` of a negative cost), back_window: for a
-- window, the one that lease was in (0 for the smooth buckets); with
-- KEYS[2...], the key's states under the rule's previous quotas, converted
-- first (quota_change.lua, from ARGV[10...]).
-- Grants `need` units or none, and up to `want`, but never more than an
-- even share of what is left among the gateways holding leases on the key
-- (`need` excepted): a few gateways cannot strand the quota.
-- Returns {granted, remaining, wait_ms, reset_ms, lease_ms, window}: on a
-- deny (granted 0) wait_ms is when `need` fits; a lease ends at its
-- window's end, and names that window (0 for the smooth buckets).
local need = tonumber(ARGV[4])
local want = tonumber(ARGV[5])
local holder = ARGV[6]
local lease_ms = tonumber(ARGV[7])
local tag = string.match(KEYS[1], '^(.*})')
-- A key blocked through the control handle gets no lease.
local lock = tag .. ':lock'
local holders = tag .. ':holders'
redis.call('ZREMRANGEBYSCORE', holders, '-inf', now_ms)
local back = tonumber(ARGV[8])
local back_window = tonumber(ARGV[9])
if back_window == 0 then back_window = nil end
if KEYS[2] then
  changed_from(10)
  moves().migrate(KEYS[1], 2)
end
if back > 0 then decide(KEYS[1], -back, back_window) end

local locked = redis.call('PTTL', lock)
if locked > 0 then return {0, 0, locked, locked, 0, 0} end
local allowed, remaining, wait, reset, _, left_ms, window_id = decide(KEYS[1], need)
if allowed == 0 then return {0, 0, wait, reset, 0, 0} end
local granted = need
local others = redis.call('ZCARD', holders)
if redis.call('ZSCORE', holders, holder) then others = others - 1 end
-- `remaining` counts whole units that still fit now.
local share = math.floor((remaining + need) / (others + 1))
local extra = math.min(want, share, remaining + need) - need
if extra > 0 then
  local a2, rem2, wait2, reset2, _, left2, window2 = decide(KEYS[1], extra)
  if a2 == 1 then
    granted = granted + extra
    remaining, wait, reset, left_ms, window_id = rem2, wait2, reset2, left2, window2
  end
end
if left_ms and left_ms < lease_ms then lease_ms = math.max(1, left_ms) end
redis.call('ZADD', holders, now_ms + lease_ms, holder)
if redis.call('PTTL', holders) < lease_ms then redis.call('PEXPIRE', holders, lease_ms) end
return {granted, remaining, wait, reset, lease_ms, window_id or 0}
