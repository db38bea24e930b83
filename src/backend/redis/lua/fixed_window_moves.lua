-- The fixed window's moves, inside `moves()` (moved.lua): the old
-- window's count, converted (rounded up: a conversion never hands out a
-- unit), ending when the old window ends (or a new window's length from
-- now, if sooner).
m.counts = true

function m.capacity()
  return limit
end

function m.move(from, l, w, b, mode, key)
  local count = tonumber(redis.call('GET', from))
  if not count then return false end
  local ttl = redis.call('PTTL', from)
  local n = math.ceil(converted(count, l, limit, mode) - 1e-9)
  if ttl <= 0 or n <= 0 then return false end
  redis.call('SET', key, n, 'PX', math.min(ttl, window_ms))
  return true
end
