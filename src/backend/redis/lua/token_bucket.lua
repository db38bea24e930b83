-- Token bucket. State: a string, when the bucket is whole again (us): the
-- tokens now are `burst` less what flows in until then. One number, as
-- GCRA's, so one read and one write per decision beside the lock.
-- ARGV: limit, window_us, burst.
-- `decide(key, lock, cost)` returns allowed, remaining, wait_ms, reset_ms,
-- or nil and the lock's time left. On a deny wait_ms is the retry-after; on
-- an allow, the wait until one unit more than `remaining` fits (0 when the
-- quota is whole): the draft's `t`. A deny writes nothing.
local limit, window, burst, us_per_token

-- The quota decisions are made in: the call's, or a moved state's.
local function set_frame(l, w, b)
  limit, window, burst = l, w, b
  -- deficit * window / limit rather than / rate: exact for whole numbers.
  us_per_token = window / limit
end
set_frame(own_l, own_w, own_b)

-- Absorbs float error so an exactly refilled token counts.
local eps = 1e-9

local function decide(key, lock, cost)
  local v = redis.call('MGET', key, lock)
  local locked = lock_left(lock, v[2])
  if locked > 0 then return nil, locked end
  local full_at = tonumber(v[1])
  if not full_at then
    if v[1] then return moves().follow(key, v[1], lock, cost) end
    full_at = now
  end
  -- A clock step back (failover) only ever leaves fewer tokens.
  local tokens = burst - math.max(0, full_at - now) / us_per_token
  if tokens + eps < cost then
    local wait = math.ceil((cost - tokens) * us_per_token / 1000)
    local reset = math.ceil((burst - tokens) * us_per_token / 1000)
    return 0, 0, math.max(1, wait), reset
  end

  -- A negative cost gives units back (grant.lua), up to a whole bucket.
  tokens = math.min(burst, tokens - cost)
  local deficit_us = (burst - tokens) * us_per_token
  local full_ms = math.ceil(deficit_us / 1000)
  if full_ms > 0 then
    redis.call('SET', key, string.format('%.17g', now + deficit_us), 'PX', full_ms)
  else
    redis.call('DEL', key)
  end
  local remaining = math.floor(tokens + eps)
  local next_ms = 0
  if tokens + eps < burst then
    next_ms = math.max(1, math.ceil((remaining + 1 - tokens) * us_per_token / 1000))
  end
  return 1, remaining, next_ms, full_ms
end
