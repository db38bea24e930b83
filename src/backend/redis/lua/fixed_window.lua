-- Fixed window starting at the first hit. State: the units spent, a counter
-- that expires with the window: envoy's INCRBY and expiry, made exact. The
-- increment comes first and the comparison after it; a deny gives its units
-- back where they could refuse a request that fits (the count was under the
-- limit before it), so a count above the limit is only denies' residue and
-- reads as the limit. ARGV: limit, window_us, burst (unused). A window is
-- named by its end (window_end.lua comes first).
-- The module interface (`decide`'s contract among it): script/mod.rs.
local limit, window, window_ms, window_arg

-- The quota decisions are made in: the call's, or a moved state's.
local function set_frame(l, w)
  limit, window = l, w
  window_ms = math.max(1, math.ceil(w / 1000))
  -- Formatted once per call, not per decision.
  window_arg = tostring(window_ms)
end
set_frame(own_l, own_w)

-- Nothing to read ahead: the increment reads.
local function read_keys(key, list, n)
  return n
end
local reads = 0

-- Units given back (grant.lua): to their own window only.
local function give_back(key, cost, of_window)
  local v = redis.call('GET', key)
  local count = tonumber(v)
  if not count then
    if v then return moves().follow(key, v, cost, of_window) end
    return 0, 0, 1, 1
  end
  local ttl = redis.call('PTTL', key)
  if ttl > 0 and of_window and same_window(of_window, window_ms, now_ms, ttl) then
    redis.call('SET', key, math.max(0, math.min(count, limit) + cost), 'KEEPTTL')
  end
  return 0, 0, math.max(1, ttl), math.max(1, ttl)
end

local function decide(key, cost, of_window)
  if cost <= 0 then return give_back(key, cost, of_window) end
  local n = redis.pcall('INCRBY', key, cost)
  if type(n) ~= 'number' then
    -- Not a count: a tombstone (a reload moved the state).
    local v = redis.call('GET', key)
    return moves().follow(key, v, cost, of_window)
  end
  local ttl
  if n == cost then
    -- A new window.
    ttl = window_ms
    if n > limit then
      redis.call('DEL', key)
      return 0, 0, ttl, ttl
    end
    redis.call('PEXPIRE', key, window_arg)
  else
    ttl = redis.call('PTTL', key)
    -- A key without expiry: a new window.
    if ttl < 0 then
      ttl = window_ms
      redis.call('PEXPIRE', key, window_arg)
    end
  end
  if n > limit then
    if n - cost < limit then redis.call('DECRBY', key, cost) end
    return 0, 0, ttl, ttl
  end
  -- Every unit spent comes back together when the window ends; for
  -- grant.lua, the time left in the window and its name (its end).
  return 1, limit - n, ttl, ttl, nil, ttl, now_ms + ttl
end

-- The control handle's (control.lua): what a one-unit request would be
-- told, and `units` spent (down to empty) or given back (up to whole), to
-- the window `of_window` when it names one, or that ends `ends_in` ms
-- from now; `adjust` returns true when that window has ended.
-- The units spent (a residue above the limit reads as the limit) and the
-- window's time left (a new window's when there is none).
local function counted(key)
  local count = math.min(limit, tonumber(redis.call('GET', key)) or 0)
  local ttl = redis.call('PTTL', key)
  if ttl < 0 then ttl = window_ms end
  return count, ttl
end

local function peek(key)
  local count, ttl = counted(key)
  if count == 0 then return limit, 0, 0 end
  local wait = 0
  if count >= limit then wait = ttl end
  return limit - count, wait, ttl
end

local function adjust(key, units, of_window, ends_in)
  local count, ttl = counted(key)
  if of_window and not same_window(of_window, window_ms, now_ms, ttl) then return true end
  -- Windows end a window apart: half of one tells them apart.
  if ends_in and (count == 0 or math.abs(ends_in - ttl) * 2 > window_ms) then return true end
  count = math.max(0, math.min(limit, count + units))
  if count > 0 then
    redis.call('SET', key, count, 'PX', ttl)
  else
    redis.call('DEL', key)
  end
end

local function reset(key)
  redis.call('DEL', key)
end
