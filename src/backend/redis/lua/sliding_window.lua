-- Sliding window counter: two fixed windows aligned on server time.
-- KEYS[1]: base name; the counters are KEYS[1]..':'..window index (same hash tag).
-- ARGV: limit, window_us, burst (unused); `cost` is decide's argument.
-- Returns {allowed, remaining, wait_ms, reset_ms}. On a deny wait_ms is the
-- retry-after; on an allow, the wait until one unit more than `remaining`
-- fits (0 when the quota is whole): the draft's `t`.
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
-- Server time only: clients' clocks disagree.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local idx = math.floor(now / window)
local elapsed = now - idx * window
local curr_key = KEYS[1] .. ':' .. string.format('%.0f', idx)
local prev_key = KEYS[1] .. ':' .. string.format('%.0f', idx - 1)
local curr = tonumber(redis.call('GET', curr_key)) or 0
local prev = tonumber(redis.call('GET', prev_key)) or 0

-- The real wait until `c` more units fit over a current count `cur`: the
-- previous window's weight decays linearly until this window ends; after
-- that the current count becomes the decaying one.
local function wait_for(c, cur)
  local room = limit - c - cur
  if room >= 0 and prev > 0 then
    return window * (1 - room / prev) - elapsed
  end
  local after = 0
  if cur > limit - c then
    after = window * (1 - (limit - c) / cur)
  end
  return window - elapsed + after
end

local estimate = prev * (1 - elapsed / window) + curr
-- Absorbs float error on exact boundaries.
local eps = 1e-9
if estimate + cost > limit + eps then
  local wait = wait_for(cost, curr)
  local reset
  if curr > 0 then reset = 2 * window - elapsed else reset = window - elapsed end
  return {0, 0, math.max(1, math.ceil(wait / 1000)), math.ceil(reset / 1000)}
end

local n = redis.call('INCRBY', curr_key, cost)
if n == cost then
  -- Needed until the next window ends.
  redis.call('PEXPIRE', curr_key, math.ceil((2 * window - elapsed) / 1000))
end
left_ms = math.max(1, math.floor((window - elapsed) / 1000))
local remaining = math.max(0, math.floor(limit - (prev * (1 - elapsed / window) + n) + eps))
-- After spending, one unit more than `remaining` always waits a little.
local next_ms = math.max(1, math.ceil(wait_for(remaining + 1, n) / 1000))
return {1, remaining, next_ms, math.ceil((2 * window - elapsed) / 1000)}
