-- A fixed window whose edges are calendar boundaries (calendar.lua comes
-- first). State: a hash {s = window start, e = window end (s), c = units
-- spent}. ARGV: limit, period ('day' | 'month'), utc_offset_s.
-- `decide(key, lock, cost)` returns allowed, remaining, wait_ms, reset_ms,
-- window_s, or nil and the lock's time left: wait_ms and reset_ms are both
-- the time to the window's end, when every unit comes back.
local limit = tonumber(ARGV[1])
local secs = tonumber(t[1])
local start, finish = calendar_window(ARGV[2], tonumber(ARGV[3]), secs)
local reset_ms = math.max(1, math.ceil(((finish - secs) * 1000000 - tonumber(t[2])) / 1000))

local function decide(key, lock, cost)
  local locked = lock_left(lock, true)
  if locked > 0 then return nil, locked end
  local state = redis.call('HMGET', key, 's', 'e', 'c')
  local count = 0
  -- A count from another window is void: an earlier one (the key outlived
  -- its expiry by a tick), or a day that began with this month.
  if tonumber(state[1]) == start and tonumber(state[2]) == finish then
    count = tonumber(state[3]) or 0
  end
  if count + cost > limit then
    return 0, 0, reset_ms, reset_ms, finish - start
  end
  count = count + cost
  left_ms = reset_ms
  redis.call('HSET', key, 's', start, 'e', finish, 'c', count)
  -- A second past the edge: the check above, not the expiry, ends the window.
  redis.call('PEXPIREAT', key, finish * 1000 + 1000)
  return 1, limit - count, reset_ms, reset_ms, finish - start
end
