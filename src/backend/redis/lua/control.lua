-- The control handle's operations on one key, over an algorithm's module
-- (clock.lua, quota_change.lua and the algorithm's file come first, as in
-- its rate script, whose `peek(key)`, `adjust(key, units, of_window)` and
-- `reset(key)` this calls).
-- KEYS[1]: the algorithm's key, as the rate script names it; the lock and
-- the lockout's deny count are the rule and key's own (`…}:lock`,
-- `…}:denies`).
-- ARGV: the rate script's three (limit, window_us, burst; the calendar's
-- limit, period, utc_offset_s), then op ('adjust' | 'reset' | 'block' |
-- 'unblock'), units (adjust: > 0 spends, < 0 gives back, 0 reads),
-- block_ms, and optionally the window an adjustment is for (a lease's
-- leftovers name the window they were granted in: a return that arrives
-- after that window ended is void).
-- Returns {remaining, wait_ms, reset_ms, locked_ms}: what a request of one
-- unit would be told now, without spending it.
local op = ARGV[4]
local units = tonumber(ARGV[5])
local tag = string.match(KEYS[1], '^(.*})')
local lock = tag .. ':lock'
if op == 'block' then
  redis.call('SET', lock, 1, 'PX', ARGV[6])
  redis.call('DEL', tag .. ':denies')
  return {0, 0, 0, tonumber(ARGV[6])}
end
if op == 'unblock' or op == 'reset' then
  redis.call('DEL', lock, tag .. ':denies')
end
if op == 'reset' then
  reset(KEYS[1])
elseif op == 'adjust' and units ~= 0 then
  adjust(KEYS[1], units, tonumber(ARGV[7]))
end
local remaining, wait, reset_ms = peek(KEYS[1])
if remaining > 0 then wait = 0 end
return {remaining, wait, reset_ms, math.max(0, redis.call('PTTL', lock))}
