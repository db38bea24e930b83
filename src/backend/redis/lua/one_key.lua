-- The moves of an algorithm whose state is one key (GCRA, the token bucket
-- and the fixed window), inside `moves()` (moved.lua): the key is absent or holds a state
-- or a tombstone, and a tombstone replaces the state it buries.
function m.absent(key)
  return redis.call('EXISTS', key) == 0
end

function m.movable()
  return true
end

function m.bury(from, tomb, ttl)
  redis.call('SET', from, tomb, 'PX', ttl)
end
