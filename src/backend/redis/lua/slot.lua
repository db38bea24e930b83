-- Concurrency slots for one key, for ConcurrencyLimitLayer's Redis backend.
--
-- KEYS[1]  sorted set of the key's slots: member = slot id, score = expiry (ms)
-- ARGV[1]  "acquire" | "release" | "renew"
-- acquire, release:
--   ARGV[2]  slot id (unique per request, a 128-bit hex string)
--   ARGV[3]  max in flight (acquire), integer >= 1
--   ARGV[4]  slot TTL in ms (acquire), integer >= 1
--   ARGV[5]  retry hint in ms (acquire), integer >= 1
-- renew (every slot one gateway holds on this key, in one call):
--   ARGV[2]  slot TTL in ms, integer >= 1
--   ARGV[3..] slot ids
--
-- The clock is Redis TIME, never the caller's, so gateways with skewed clocks
-- agree on expiry. A slot a crashed gateway never released stops counting
-- once its TTL passes: expired members are removed before every count. A
-- request that outlives its TTL must renew (the layer does every TTL/3 while
-- the permit lives), or its slot may be given away.
--
-- Returns {ok, in_flight, retry_after_ms}:
--   acquire: {1, in_flight_after, 0}       admitted, the slot is held
--            {0, in_flight, retry_after_ms} refused; retry_after_ms is the hint,
--                                           or sooner if the earliest slot
--                                           expires sooner (a slot frees then
--                                           at the latest)
--   release: {1 if the slot was held else 0, in_flight_after, 0}
--   renew:   one flag per id: 1 if the slot was held (and is extended) else 0

-- Redis time in ms (clock.lua comes first).
local now = now_ms
local key, op, id = KEYS[1], ARGV[1], ARGV[2]

redis.call('ZREMRANGEBYSCORE', key, '-inf', now)

-- The set lives as long as its longest slot: idle keys vanish on their own.
local function expire_with_last_slot()
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] then redis.call('PEXPIREAT', key, math.floor(tonumber(last[2]))) end
end

if op == 'acquire' then
  local limit, ttl, hint = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
  local held = redis.call('ZCARD', key)
  if held >= limit then
    local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    local wait = hint
    if first[2] then wait = math.min(hint, tonumber(first[2]) - now) end
    return {0, held, math.max(1, wait)}
  end
  redis.call('ZADD', key, now + ttl, id)
  expire_with_last_slot()
  return {1, held + 1, 0}
elseif op == 'release' then
  local removed = redis.call('ZREM', key, id)
  return {removed, redis.call('ZCARD', key), 0}
elseif op == 'renew' then
  local ttl = tonumber(ARGV[2])
  local held = {}
  for i = 3, #ARGV do
    -- XX: only an existing slot is extended; an expired one stays gone.
    redis.call('ZADD', key, 'XX', now + ttl, ARGV[i])
    -- ZSCORE, not ZADD CH: a renew in the same millisecond changes nothing
    -- yet the slot is held.
    held[#held + 1] = redis.call('ZSCORE', key, ARGV[i]) and 1 or 0
  end
  expire_with_last_slot()
  return held
end
return redis.error_reply('unknown op ' .. tostring(op))
