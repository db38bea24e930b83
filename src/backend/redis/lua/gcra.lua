-- GCRA, as governor's test_n_all. State: a string, the theoretical arrival
-- time (us). ARGV: limit, window_us, burst.
-- `decide(key, cost, of_window, vals, at)` returns allowed, remaining,
-- wait_ms, reset_ms; `vals[at]` is the key's value when the caller read it
-- (`read_keys`), `vals` nil to read it here. On a deny wait_ms is the retry-after; on an allow,
-- the wait until one unit more than `remaining` fits (0 when the quota is
-- whole): the draft's `t`. A deny writes nothing. A negative cost gives
-- units back. (Several values, not a table: no garbage per decision.)
local limit, window, burst, interval, tolerance

-- The quota decisions are made in: the call's, or a moved state's.
local function set_frame(l, w, b)
  limit, window, burst = l, w, b
  interval = window / limit
  tolerance = (burst - 1) * interval
end
set_frame(own_l, own_w, own_b)

-- The values batch.lua reads for a key in one MGET with the batch's others.
local function read_keys(key, list, n)
  list[n + 1] = key
  return n + 1
end
local reads = 1

-- Absorbs float error on exact boundaries.
local eps = 1e-6

local function decide(key, cost, of_window, vals, at)
  local v
  if vals then v = vals[at] else v = redis.call('GET', key) end
  local tat = tonumber(v)
  if not tat then
    if v then return moves().follow(key, v, cost, of_window) end
    tat = now
  end
  local earliest = tat + (cost - 1) * interval - tolerance
  if now + eps < earliest then
    local reset = math.ceil(math.max(0, tat - now) / 1000)
    return 0, 0, math.max(1, math.ceil((earliest - now) / 1000)), reset
  end

  local new_tat = math.max(tat, now) + cost * interval
  local reset_ms = math.ceil((new_tat - now) / 1000)
  if reset_ms > 0 then
    redis.call('SET', key, string.format('%.17g', new_tat), 'PX', reset_ms)
  else
    -- Only a negative cost (units given back) gets here: whole.
    redis.call('DEL', key)
  end
  -- Single cells still allowed now: those with new_tat + j*interval - tolerance <= now.
  local room = now + tolerance - new_tat
  local remaining = 0
  if room + eps >= 0 then
    remaining = math.floor(room / interval + eps) + 1
  end
  -- Cell `remaining + 1` fits once new_tat + remaining * interval - tolerance <= now.
  local next_ms = 0
  if remaining < burst then
    next_ms = math.max(1, math.ceil((new_tat + remaining * interval - tolerance - now) / 1000))
  end
  return 1, remaining, next_ms, reset_ms
end
