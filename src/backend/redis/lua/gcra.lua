-- GCRA, as governor's test_n_all. State: a string, the theoretical arrival
-- time (us). ARGV: limit, window_us, burst. A negative cost gives units
-- back. (Several values, not a table: no garbage per decision.)
-- The module interface (`decide`'s contract among it): script/mod.rs.
local limit, window, burst, interval, tolerance

-- The quota decisions are made in: the call's, or a moved state's.
local function set_frame(l, w, b)
  limit, window, burst = l, w, b
  interval = window / limit
  tolerance = (burst - 1) * interval
end
set_frame(own_l, own_w, own_b)

-- Absorbs float error on exact boundaries.
local eps = 1e-6

-- What a state `tat` (not before now) tells: the units that fit now, the
-- wait until one more does (0 when whole), and until the bucket is whole.
local function told(tat)
  -- Single cells allowed now: those with tat + j*interval - tolerance <= now.
  local room = now + tolerance - tat
  local remaining = 0
  if room + eps >= 0 then
    remaining = math.floor(room / interval + eps) + 1
  end
  -- Cell `remaining + 1` fits once tat + remaining * interval - tolerance <= now.
  local next_ms = 0
  if remaining < burst then
    next_ms = math.max(1, math.ceil((tat + remaining * interval - tolerance - now) / 1000))
  end
  return remaining, next_ms, math.max(0, math.ceil((tat - now) / 1000))
end

local function decide(key, cost, of_window, vals, at)
  local v = value(key, vals, at)
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
  -- Only a negative cost (units given back) can leave the bucket whole.
  local reset_ms = store_at(key, new_tat)
  local remaining, next_ms = told(math.max(new_tat, now))
  return 1, remaining, next_ms, reset_ms
end

-- The control handle's (control.lua): what a one-unit request would be
-- told, and `units` spent (down to empty) or given back (up to whole).
local function peek(key)
  return told(math.max(tonumber(redis.call('GET', key)) or now, now))
end

local function adjust(key, units)
  local tat = tonumber(redis.call('GET', key)) or now
  if units > 0 then
    tat = math.min(math.max(tat, now) + units * interval, now + burst * interval)
  else
    tat = tat + units * interval
  end
  store_at(key, tat)
end

local function reset(key)
  redis.call('DEL', key)
end
