-- Fixed window starting at the first hit. State: a string, "<units spent>
-- <window end, ms of Redis time>", expiring with the window: one read and
-- one write per decision, beside the lock. ARGV: limit, window_us, burst
-- (unused).
-- `decide(key, lock, cost)` returns {allowed, remaining, wait_ms, reset_ms},
-- or nil and the lock's time left. On a deny wait_ms is the retry-after; on
-- an allow, the wait until one unit more than `remaining` fits (0 when the
-- quota is whole): the draft's `t`. A deny writes nothing.
local limit = tonumber(ARGV[1])
local window_ms = math.max(1, math.ceil(tonumber(ARGV[2]) / 1000))

-- A window's count and end, from its state; a new window when there is
-- none or it has ended.
local function fixed_window(state)
  if state then
    local c, e = string.match(state, '^(%d+) (%d+)$')
    local count, finish = tonumber(c), tonumber(e)
    if count and finish and finish > now_ms then return count, finish end
  end
  return 0, now_ms + window_ms
end

-- `of_window`, for units given back (a negative cost): the window they were
-- spent in; they are void in any other.
local function decide(key, lock, cost, of_window)
  local v = redis.call('MGET', key, lock)
  local locked = lock_left(lock, v[2])
  if locked > 0 then return nil, locked end
  local count, finish = fixed_window(v[1])
  local ttl = finish - now_ms
  if of_window and of_window ~= finish then return {0, 0, ttl, ttl} end
  window_id = finish
  if count + cost > limit then
    return {0, 0, ttl, ttl}
  end
  count = math.max(0, count + cost)
  redis.call('SET', key, count .. ' ' .. finish, 'PX', ttl)
  -- Every unit spent comes back together when the window ends.
  left_ms = ttl
  return {1, limit - count, ttl, ttl}
end
