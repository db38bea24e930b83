-- The control handle's operations on one key (calendar.lua and
-- window_end.lua come first).
-- KEYS[1]: the algorithm's key, as the rate scripts name it; the lock and
-- the lockout's deny count are the rule and key's own, as in lock.lua.
-- ARGV: op ('adjust' | 'reset' | 'block' | 'unblock'), algorithm ('gcra' |
-- 'tb' | 'fw' | 'sw' | 'cal'), limit, window_us, burst, units (adjust:
-- > 0 spends, < 0 gives back, 0 reads), block_ms, period, utc_offset_s,
-- and for a window optionally the window an adjustment is for.
-- Returns {remaining, wait_ms, reset_ms, locked_ms}: what a request of one
-- unit would be told now, without spending it.
-- Spending stops at an empty bucket, giving back at a whole one.
local op = ARGV[1]
local alg = ARGV[2]
local limit = tonumber(ARGV[3])
local window = tonumber(ARGV[4])
local burst = tonumber(ARGV[5])
local units = tonumber(ARGV[6])
-- A lease's leftovers name the window they were granted in (the fixed
-- window's end in ms, to a millisecond or two; the sliding window's index): a return that arrives after
-- that window ended is void.
local of_window = tonumber(ARGV[10])
local tag = string.match(KEYS[1], '^(.*})')
local lock = tag .. ':lock'
local denies = tag .. ':denies'
if op == 'block' then
  redis.call('SET', lock, 1, 'PX', ARGV[7])
  redis.call('DEL', denies)
  return {0, 0, 0, tonumber(ARGV[7])}
end
if op == 'unblock' or op == 'reset' then
  redis.call('DEL', lock, denies)
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local eps = 1e-9
local function ms(us) return math.max(0, math.ceil(us / 1000)) end
local function locked_ms()
  return math.max(0, redis.call('PTTL', lock))
end

if alg == 'sw' then
  local idx = math.floor(now / window)
  local elapsed = now - idx * window
  local curr_key = KEYS[1] .. ':' .. string.format('%.0f', idx)
  local prev_key = KEYS[1] .. ':' .. string.format('%.0f', idx - 1)
  if op == 'reset' then
    redis.call('DEL', curr_key, prev_key)
    return {limit, 0, 0, 0}
  end
  local curr = tonumber(redis.call('GET', curr_key)) or 0
  local prev = tonumber(redis.call('GET', prev_key)) or 0
  local weighted = prev * (1 - elapsed / window)
  if op == 'adjust' and units ~= 0 and (not of_window or of_window == idx) then
    local next = math.max(0, math.min(curr + units, math.max(curr, math.floor(limit - weighted + eps))))
    if next ~= curr then
      redis.call('SET', curr_key, next, 'PX', math.ceil((2 * window - elapsed) / 1000))
      curr = next
    end
  end
  local remaining = math.max(0, math.floor(limit - weighted - curr + eps))
  -- An upper bound: the window's end, when only the decaying count is left.
  local reset = 2 * window - elapsed
  if curr == 0 then reset = window - elapsed end
  if curr == 0 and prev == 0 then reset = 0 end
  return {remaining, ms(window - elapsed), ms(reset), locked_ms()}
end

if op == 'reset' then
  redis.call('DEL', KEYS[1])
  return {burst, 0, 0, 0}
end

if alg == 'gcra' then
  local interval = window / limit
  local tolerance = (burst - 1) * interval
  local tat = tonumber(redis.call('GET', KEYS[1])) or now
  if op == 'adjust' and units ~= 0 then
    if units > 0 then
      tat = math.min(math.max(tat, now) + units * interval, now + burst * interval)
    else
      tat = tat + units * interval
    end
    if tat > now then
      redis.call('SET', KEYS[1], string.format('%.17g', tat), 'PX', math.max(1, ms(tat - now)))
    else
      redis.call('DEL', KEYS[1])
    end
  end
  if tat <= now then return {burst, 0, 0, locked_ms()} end
  local room = now + tolerance - tat
  if room + 1e-6 >= 0 then
    return {math.min(burst, math.floor(room / interval + 1e-6) + 1), 0, ms(tat - now), locked_ms()}
  end
  return {0, math.max(1, ms(tat - tolerance - now)), ms(tat - now), locked_ms()}
end

if alg == 'tb' then
  -- token_bucket.lua's state: when the bucket is whole again (us).
  local us_per_token = window / limit
  local full_at = tonumber(redis.call('GET', KEYS[1])) or now
  local tokens = burst - math.max(0, full_at - now) / us_per_token
  if op == 'adjust' and units ~= 0 then
    tokens = math.max(0, math.min(burst, tokens - units))
    local deficit_us = (burst - tokens) * us_per_token
    if tokens + eps < burst then
      redis.call('SET', KEYS[1], string.format('%.17g', now + deficit_us), 'PX', math.max(1, ms(deficit_us)))
    else
      redis.call('DEL', KEYS[1])
    end
  end
  local remaining = math.floor(tokens + eps)
  local wait = 0
  if remaining == 0 then wait = math.max(1, ms((1 - tokens) * us_per_token)) end
  return {remaining, wait, ms((burst - tokens) * us_per_token), locked_ms()}
end

-- The fixed windows: a count that every unit leaves at the window's end.
local count, ttl
if alg == 'cal' then
  local secs = tonumber(t[1])
  local start, finish = calendar_window(ARGV[8], tonumber(ARGV[9]), secs)
  local state = redis.call('HMGET', KEYS[1], 's', 'e', 'c')
  count = 0
  if tonumber(state[1]) == start and tonumber(state[2]) == finish then
    count = tonumber(state[3]) or 0
  end
  ttl = math.max(1, math.ceil(((finish - secs) * 1000000 - tonumber(t[2])) / 1000))
  if op == 'adjust' and units ~= 0 then
    count = math.max(0, math.min(limit, count + units))
    redis.call('HSET', KEYS[1], 's', start, 'e', finish, 'c', count)
    redis.call('PEXPIREAT', KEYS[1], finish * 1000 + 1000)
  end
else
  -- A count above the limit is denies' residue (fixed_window.lua).
  count = math.min(limit, tonumber(redis.call('GET', KEYS[1])) or 0)
  ttl = redis.call('PTTL', KEYS[1])
  if ttl < 0 then ttl = math.max(1, math.ceil(window / 1000)) end
  local window_ms = math.max(1, math.ceil(window / 1000))
  local same = not of_window or same_window(of_window, window_ms, math.floor(now / 1000), ttl)
  if op == 'adjust' and units ~= 0 and same then
    count = math.max(0, math.min(limit, count + units))
    if count > 0 then
      redis.call('SET', KEYS[1], count, 'PX', ttl)
    else
      redis.call('DEL', KEYS[1])
    end
  end
  if count == 0 then ttl = 0 end
end
local wait = 0
if count >= limit then wait = ttl end
return {limit - count, wait, ttl, locked_ms()}
