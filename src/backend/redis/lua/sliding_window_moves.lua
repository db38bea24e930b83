-- The sliding window's moves, inside `moves()` (moved.lua), of the same
-- window only:
-- each of the two windows' counts, converted (rounded up). With another
-- window the counts are not comparable: the key starts afresh, and nothing
-- moves.
m.counts = true

function m.capacity()
  return limit
end

function m.absent(key)
  return redis.call('EXISTS', key, key .. curr_suffix, key .. prev_suffix) == 0
end

function m.movable(w)
  return w == window
end

-- Leaves a tombstone at `from`, whose counts go.
function m.bury(from, tomb, ttl)
  redis.call('DEL', from .. curr_suffix, from .. prev_suffix)
  redis.call('SET', from, tomb, 'PX', ttl)
end

function m.move(from, l, w, b, mode, key)
  local v = redis.call('MGET', from .. curr_suffix, from .. prev_suffix)
  if not v[1] and not v[2] then return false end
  for i, k in ipairs({key .. curr_suffix, key .. prev_suffix}) do
    local n = math.ceil(converted(tonumber(v[i]) or 0, l, limit, mode) - 1e-9)
    if n > 0 then redis.call('SET', k, n, 'PX', keep_arg) end
  end
  return true
end
