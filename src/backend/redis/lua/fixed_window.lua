-- Fixed window starting at the first hit. KEYS[1]: string counter, expiring with the window.
-- ARGV: limit, window_us, burst (unused); `cost` is decide's argument.
-- Returns {allowed, remaining, wait_ms, reset_ms}. On a deny wait_ms is the
-- retry-after; on an allow, the wait until one unit more than `remaining`
-- fits (0 when the quota is whole): the draft's `t`.
local limit = tonumber(ARGV[1])
local window_ms = math.max(1, math.ceil(tonumber(ARGV[2]) / 1000))

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
-- Every unit spent comes back together when the window ends.
left_ms = ttl
return {1, limit - count, math.max(1, ttl), ttl}
