-- Fixed window starting at the first hit. State: the units spent, a counter
-- that expires with the window (envoy's shape, made exact: a deny does not
-- count). ARGV: limit, window_us, burst (unused).
-- `decide(key, lock, cost, of_window)` returns allowed, remaining,
-- wait_ms, reset_ms, or nil and the lock's time left. On a deny wait_ms is
-- the retry-after; on an allow, the wait until one unit more than
-- `remaining` fits (0 when the quota is whole): the draft's `t`. A deny
-- writes nothing. A window is named by its end (window_end.lua comes
-- first).
local limit, window, window_ms, window_arg

-- The quota decisions are made in: the call's, or a moved state's.
local function set_frame(l, w)
  limit, window = l, w
  window_ms = math.max(1, math.ceil(w / 1000))
  -- Formatted once per call, not per decision.
  window_arg = tostring(window_ms)
end
set_frame(own_l, own_w)


local function decide(key, lock, cost, of_window)
  local v = redis.call('MGET', key, lock)
  local locked = lock_left(lock, v[2])
  if locked > 0 then return nil, locked end
  local count = tonumber(v[1])
  if not count then
    if v[1] then return moves().follow(key, v[1], lock, cost, of_window) end
    count = 0
  end
  if count + cost > limit or (cost < 0 and count == 0) then
    -- A deny does not consume. ttl < 0 only for a key without expiry;
    -- treat it as a new window.
    local ttl = redis.call('PTTL', key)
    if ttl < 0 then ttl = window_ms end
    return 0, 0, ttl, ttl
  end
  if cost < 0 then
    -- Units given back (grant.lua): to their own window only.
    local ttl = redis.call('PTTL', key)
    if ttl > 0 and of_window and same_window(of_window, window_ms, now_ms, ttl) then
      redis.call('DECRBY', key, math.min(-cost, count))
    end
    return 0, 0, math.max(1, ttl), math.max(1, ttl)
  end
  local n = redis.call('INCRBY', key, cost)
  local ttl
  if n == cost then
    redis.call('PEXPIRE', key, window_arg)
    ttl = window_ms
  else
    ttl = redis.call('PTTL', key)
  end
  -- Every unit spent comes back together when the window ends.
  left_ms = ttl
  window_id = now_ms + ttl
  return 1, limit - n, ttl, ttl
end
