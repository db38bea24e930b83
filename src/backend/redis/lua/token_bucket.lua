-- Token bucket. State: a string, when the bucket is whole again (us): the
-- tokens now are `burst` less what flows in until then. One number, as
-- GCRA's, so one read and one write per decision.
-- ARGV: limit, window_us, burst. A negative cost gives units back, up to a
-- whole bucket.
-- The module interface (`decide`'s contract among it): script/mod.rs.
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

-- The tokens a state `full_at` leaves now. A clock step back (failover)
-- only ever leaves fewer.
local function tokens_at(full_at)
  return burst - math.max(0, full_at - now) / us_per_token
end

-- What `tokens` tell: whole units now, the wait until one more (0 when
-- whole), and until the bucket is whole.
local function told(tokens)
  local remaining = math.floor(tokens + eps)
  local next_ms = 0
  if tokens + eps < burst then
    next_ms = math.max(1, math.ceil((remaining + 1 - tokens) * us_per_token / 1000))
  end
  return remaining, next_ms, math.max(0, math.ceil((burst - tokens) * us_per_token / 1000))
end

-- Writes the state of `tokens` now, or nothing for a whole bucket; the ms
-- until it is whole.
local function store(key, tokens)
  return store_at(key, now + (burst - tokens) * us_per_token)
end

local function decide(key, cost, of_window, vals, at)
  local v = value(key, vals, at)
  local full_at = tonumber(v)
  if not full_at then
    if v then return moves().follow(key, v, cost, of_window) end
    full_at = now
  end
  local tokens = tokens_at(full_at)
  if tokens + eps < cost then
    local wait = math.ceil((cost - tokens) * us_per_token / 1000)
    local reset = math.ceil((burst - tokens) * us_per_token / 1000)
    return 0, 0, math.max(1, wait), reset
  end

  tokens = math.min(burst, tokens - cost)
  local full_ms = store(key, tokens)
  local remaining, next_ms = told(tokens)
  return 1, remaining, next_ms, full_ms
end

-- The control handle's (control.lua): what a one-unit request would be
-- told, and `units` spent (down to empty) or given back (up to whole).
local function peek(key)
  return told(tokens_at(tonumber(redis.call('GET', key)) or now))
end

local function adjust(key, units)
  local tokens = tokens_at(tonumber(redis.call('GET', key)) or now)
  store(key, math.max(0, math.min(burst, tokens - units)))
end

local function reset(key)
  redis.call('DEL', key)
end
