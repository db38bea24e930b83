-- Token bucket. KEYS[1]: hash {t = tokens, ts = last update (us)}.
-- ARGV: limit, window_us, burst; `cost` is decide's argument.
-- Returns {allowed, remaining, wait_ms, reset_ms}. On a deny wait_ms is the
-- retry-after; on an allow, the wait until one unit more than `remaining`
-- fits (0 when the quota is whole): the draft's `t`.
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
-- Server time only: clients' clocks disagree.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local st = redis.call('HMGET', KEYS[1], 't', 'ts')
local tokens = tonumber(st[1])
local ts = tonumber(st[2])
if tokens == nil or ts == nil then
  tokens = burst
  ts = now
end
-- A clock step back (failover) must not refill.
local elapsed = math.max(0, now - ts)
-- deficit * window / limit rather than / rate: exact for whole numbers.
tokens = math.min(burst, tokens + elapsed * limit / window)

-- Absorbs float error so an exactly refilled token counts.
local eps = 1e-9
if tokens + eps < cost then
  local wait = math.ceil((cost - tokens) * window / limit / 1000)
  local reset = math.ceil((burst - tokens) * window / limit / 1000)
  return {0, 0, math.max(1, wait), reset}
end

-- A negative cost gives units back (grant.lua), up to a whole bucket.
tokens = math.min(burst, tokens - cost)
local full_ms = math.ceil((burst - tokens) * window / limit / 1000)
redis.call('HSET', KEYS[1], 't', tokens, 'ts', now)
redis.call('PEXPIRE', KEYS[1], math.max(1, full_ms))
local remaining = math.floor(tokens + eps)
local next_ms = 0
if tokens + eps < burst then
  next_ms = math.max(1, math.ceil((remaining + 1 - tokens) * window / limit / 1000))
end
return {1, remaining, next_ms, full_ms}
