-- Token bucket. State: a string, "<tokens> <last update, us>" (one read and
-- one write per decision, beside the lock). ARGV: limit, window_us, burst.
-- `decide(key, lock, cost)` returns {allowed, remaining, wait_ms, reset_ms},
-- or nil and the lock's time left. On a deny wait_ms is the retry-after; on
-- an allow, the wait until one unit more than `remaining` fits (0 when the
-- quota is whole): the draft's `t`. A deny writes nothing.
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
-- Absorbs float error so an exactly refilled token counts.
local eps = 1e-9

local function decide(key, lock, cost)
  local v = redis.call('MGET', key, lock)
  local locked = lock_left(lock, v[2])
  if locked > 0 then return nil, locked end
  local tokens, ts
  if v[1] then
    local a, b = string.match(v[1], '^(%S+) (%S+)$')
    tokens, ts = tonumber(a), tonumber(b)
  end
  if tokens == nil or ts == nil then
    tokens = burst
    ts = now
  end
  -- A clock step back (failover) must not refill.
  local elapsed = math.max(0, now - ts)
  -- deficit * window / limit rather than / rate: exact for whole numbers.
  tokens = math.min(burst, tokens + elapsed * limit / window)

  if tokens + eps < cost then
    local wait = math.ceil((cost - tokens) * window / limit / 1000)
    local reset = math.ceil((burst - tokens) * window / limit / 1000)
    return {0, 0, math.max(1, wait), reset}
  end

  -- A negative cost gives units back (grant.lua), up to a whole bucket.
  tokens = math.min(burst, tokens - cost)
  local full_ms = math.ceil((burst - tokens) * window / limit / 1000)
  redis.call('SET', key, string.format('%.17g %.17g', tokens, now), 'PX', math.max(1, full_ms))
  local remaining = math.floor(tokens + eps)
  local next_ms = 0
  if tokens + eps < burst then
    next_ms = math.max(1, math.ceil((remaining + 1 - tokens) * window / limit / 1000))
  end
  return {1, remaining, next_ms, full_ms}
end
