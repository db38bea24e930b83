-- Concurrency leases for one key, for a Redis backend of ConcurrencyLimitLayer.
-- Not wired yet: the Redis backend lives on another branch. Run with EVALSHA.
--
-- KEYS[1]  sorted set of the key's leases: member = lease id, score = expiry (ms)
-- ARGV[1]  "acquire" | "release" | "renew"
-- ARGV[2]  lease id (unique per request, e.g. a random 128-bit hex string)
-- ARGV[3]  max in flight (acquire), integer >= 1
-- ARGV[4]  lease TTL in ms (acquire, renew), integer >= 1
--
-- The clock is Redis TIME, never the caller's, so gateways with skewed clocks
-- agree on expiry. A lease a crashed gateway never released stops counting
-- once its TTL passes: expired members are removed before every count. A
-- request that outlives its TTL must renew (e.g. every TTL/3 while its body
-- streams), or its slot may be given away.
--
-- Returns:
--   acquire: {1, in_flight_after, 0}       admitted, the lease is held
--            {0, in_flight, retry_after_ms} refused; retry_after_ms is when the
--                                           earliest lease expires at the latest
--   release: {1 if the lease was held else 0, in_flight_after, 0}
--   renew:   {1 if the lease was held (and is extended) else 0, in_flight, 0}

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local key, op, id = KEYS[1], ARGV[1], ARGV[2]

redis.call('ZREMRANGEBYSCORE', key, '-inf', now)

if op == 'acquire' then
  local limit, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])
  local held = redis.call('ZCARD', key)
  if held >= limit then
    local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    local wait = 1
    if first[2] then wait = math.max(1, tonumber(first[2]) - now) end
    return {0, held, wait}
  end
  redis.call('ZADD', key, now + ttl, id)
  -- The set lives as long as its longest lease: idle keys vanish on their own.
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', key, math.floor(tonumber(last[2])))
  return {1, held + 1, 0}
elseif op == 'release' then
  local removed = redis.call('ZREM', key, id)
  return {removed, redis.call('ZCARD', key), 0}
elseif op == 'renew' then
  local ttl = tonumber(ARGV[4])
  -- XX: only an existing lease is extended; an expired one stays gone.
  local changed = redis.call('ZADD', key, 'XX', 'CH', now + ttl, id)
  if changed == 1 then
    local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    redis.call('PEXPIREAT', key, math.floor(tonumber(last[2])))
  end
  return {changed, redis.call('ZCARD', key), 0}
end
return redis.error_reply('unknown op ' .. tostring(op))
