-- Fixed window starting at the first hit. KEYS[1]: string counter, expiring with the window.
-- ARGV: limit, window_us, burst (unused), cost.
-- Returns {allowed, remaining, retry_after_ms, reset_ms}; on an allow that leaves
-- nothing, retry_after_ms is the wait until one more unit fits (0 otherwise).
local limit = tonumber(ARGV[1])
local window_ms = math.max(1, math.ceil(tonumber(ARGV[2]) / 1000))
local cost = tonumber(ARGV[4])

local count = tonumber(redis.call('GET', KEYS[1])) or 0
local ttl = redis.call('PTTL', KEYS[1])
if count + cost > limit then
  -- A deny does not consume. ttl < 0 only for a key without expiry; treat it as a new window.
  if ttl < 0 then ttl = window_ms end
  return {0, 0, math.max(1, ttl), ttl}
end

count = redis.call('INCRBY', KEYS[1], cost)
if ttl < 0 then
  redis.call('PEXPIRE', KEYS[1], window_ms)
  ttl = window_ms
end
local next_ms = 0
if count >= limit then next_ms = math.max(1, ttl) end
return {1, limit - count, next_ms, ttl}
