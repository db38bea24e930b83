-- The live instance count. KEYS[1]: sorted set of gateway ids, each scored
-- by when its announcement expires (ms, Redis time).
-- ARGV: op ('announce' | 'leave'), id, ttl_ms.
-- Returns how many gateways announced within their TTL, this one included.
-- Redis time in ms (clock.lua comes first).
local now = now_ms
if ARGV[1] == 'leave' then
  redis.call('ZREM', KEYS[1], ARGV[2])
else
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[2])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
-- The set outlives its last member by a TTL, then goes.
redis.call('PEXPIRE', KEYS[1], 2 * tonumber(ARGV[3]))
return redis.call('ZCARD', KEYS[1])
