-- Sliding window counter: two fixed windows aligned on Redis time. The
-- counters are the state key .. ':' .. window index (same hash tag).
-- ARGV: limit, window_us, burst (unused). Read ahead: the current and the
-- previous window's counts; a window is named by its index.
-- The module interface (`decide`'s contract among it): script/mod.rs.
local limit = own_l
local window = own_w

-- The quota decisions are made in: the call's, or a moved state's, which
-- is of the same window (the sliding window moves only then).
local function set_frame(l)
  limit = l
end

local idx = math.floor(now / window)
local elapsed = now - idx * window
local curr_suffix = ':' .. string.format('%.0f', idx)
local prev_suffix = ':' .. string.format('%.0f', idx - 1)
-- The previous window's weight now.
local decay = 1 - elapsed / window
-- A new counter lives until the next window ends; formatted once per call.
local keep_ms = math.ceil((2 * window - elapsed) / 1000)
local keep_arg = tostring(keep_ms)
-- Absorbs float error on exact boundaries.
local eps = 1e-9

-- The real wait until `c` more units fit over a current count `cur`, with
-- `prev` in the previous window: its weight decays linearly until this
-- window ends; after that the current count becomes the decaying one.
local function wait_for(c, cur, prev)
  local room = limit - c - cur
  if room >= 0 and prev > 0 then
    return window * (1 - room / prev) - elapsed
  end
  local after = 0
  if cur > limit - c then
    after = window * (1 - (limit - c) / cur)
  end
  return window - elapsed + after
end

-- The values batch.lua reads for a key in one MGET with the batch's others.
local function read_keys(key, list, n)
  list[n + 1], list[n + 2] = key .. curr_suffix, key .. prev_suffix
  return n + 2
end
local reads = 2

-- The time until every unit counted now has left: the next window's end
-- while this window counts any, this one's while only the last one does.
local function reset_after(curr, prev)
  if curr > 0 then return 2 * window - elapsed end
  if prev > 0 then return window - elapsed end
  return 0
end

local function decide(key, cost, of_window, vals, at)
  if of_window and of_window ~= idx then return 0, 0, 1, 1 end
  local curr_key = key .. curr_suffix
  if not vals then
    vals, at = redis.call('MGET', curr_key, key .. prev_suffix), 1
  end
  local c, p = vals[at], vals[at + 1]
  -- A key without counts here may have moved: its state key itself holds
  -- nothing but a tombstone (a move deletes the counts it leaves).
  if not c and not p then
    local moved = redis.call('GET', key)
    if moved then return moves().follow(key, moved, cost, of_window) end
  end
  local curr = tonumber(c) or 0
  local prev = tonumber(p) or 0

  local estimate = prev * decay + curr
  if estimate + cost > limit + eps then
    local wait = wait_for(cost, curr, prev)
    -- A deny's reset is at least this window's end.
    local reset = math.max(reset_after(curr, prev), window - elapsed)
    return 0, 0, math.max(1, math.ceil(wait / 1000)), math.ceil(reset / 1000)
  end

  -- A negative cost (units given back, grant.lua) stops at none.
  if curr + cost < 0 then cost = -curr end
  local n = curr
  if cost ~= 0 then n = redis.call('INCRBY', curr_key, cost) end
  if n == cost and cost > 0 then redis.call('PEXPIRE', curr_key, keep_arg) end
  local left_ms = math.max(1, math.floor((window - elapsed) / 1000))
  local remaining = math.max(0, math.floor(limit - (prev * decay + n) + eps))
  -- After spending, one unit more than `remaining` always waits a little.
  local next_ms = math.max(1, math.ceil(wait_for(remaining + 1, n, prev) / 1000))
  -- For grant.lua, the time left in the window and its name (its index).
  return 1, remaining, next_ms, keep_ms, nil, left_ms, idx
end

-- The control handle's (control.lua): what a one-unit request would be
-- told, and `units` spent (down to empty) or given back (up to whole), to
-- this window only when `of_window` names one or the reset `ends_in`
-- says so; `adjust` returns true when that window has ended.
local function counts(key)
  local v = redis.call('MGET', key .. curr_suffix, key .. prev_suffix)
  return tonumber(v[1]) or 0, tonumber(v[2]) or 0
end

local function peek(key)
  local curr, prev = counts(key)
  local remaining = math.max(0, math.floor(limit - (prev * decay + curr) + eps))
  local wait = 0
  if remaining == 0 then wait = math.max(1, math.ceil(wait_for(1, curr, prev) / 1000)) end
  return remaining, wait, math.ceil(reset_after(curr, prev) / 1000)
end

local function adjust(key, units, of_window, ends_in)
  if of_window and of_window ~= idx then return true end
  -- A charge in this window was told `keep_ms` then; windows are a window apart.
  if ends_in and math.abs(ends_in - keep_ms) * 2000 > window then return true end
  local curr, prev = counts(key)
  -- Spending stops where the estimate reaches the limit.
  local n = math.max(0, math.min(curr + units, math.max(curr, math.floor(limit - prev * decay + eps))))
  if n ~= curr then
    redis.call('SET', key .. curr_suffix, n, 'PX', keep_arg)
  end
end

-- The counts only: a tombstone at the state key keeps pointing gateways on
-- an older quota at the moved state.
local function reset(key)
  redis.call('DEL', key .. curr_suffix, key .. prev_suffix)
end
