-- Redis time, read once per call: clients' clocks disagree, and every
-- decision of a batch is made at the same instant.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now / 1000)
-- Set by a window's `decide`, for grant.lua: the time left in its window,
-- and the window's name (the fixed window's end, the sliding window's index).
local left_ms, window_id
-- A lock's time left, when its value was read beside the state (`held`):
-- one PTTL only for a key that is locked (0 when not).
local function lock_left(lock, held)
  if not held then return 0 end
  return math.max(0, redis.call('PTTL', lock))
end
