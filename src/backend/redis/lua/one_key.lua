-- The moves of an algorithm whose state is one key (GCRA, the token bucket
-- and the fixed window), for moved.lua: the key is absent or holds a state
-- or a tombstone, and a tombstone replaces the state it buries.
local function absent(key)
  return redis.call('EXISTS', key) == 0
end

local function movable()
  return true
end

local function bury(from, tomb, ttl)
  redis.call('SET', from, tomb, 'PX', ttl)
end
