-- GCRA's and the token bucket's moves, inside `moves()` (moved.lua): a
-- key's state is when it is whole again, so the units it has not got back
-- are that time over the emission interval, under any quota.
m.counts = false

function m.capacity()
  return burst
end

-- Converts the state of `from`, under the quota (l, w, b), into `key`
-- under this call's quota, as `mode` says. Whether there was one.
function m.move(from, l, w, b, mode, key)
  local at = tonumber(redis.call('GET', from))
  if not at or at <= now then return false end
  local used = converted((at - now) / (w / l), b, burst, mode)
  if used <= 0 then return false end
  local whole = now + used * (window / limit)
  redis.call('SET', key, string.format('%.17g', whole), 'PX', math.ceil((whole - now) / 1000))
  return true
end
