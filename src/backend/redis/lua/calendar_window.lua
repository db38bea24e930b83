-- A fixed window whose edges are calendar boundaries (calendar.lua comes
-- first). State: a hash {s = window start, e = window end (s), c = units
-- spent, l = the limit `c` was counted under, r = the window start a
-- reload's mode converted it in}. ARGV: limit, period ('day' | 'month',
-- or an aligned window's length in seconds), utc_offset_s.
-- A count of another limit converts (quota_change.lua): by the rule's
-- mode once, when that limit is one of its previous quotas and the window
-- began before the reload; otherwise proportionally (a gateway on other
-- rules), rounded up; not at all in mode 0 (`quota_fn`: a key's plan
-- changes, its count stays).
-- `decide` returns a fifth value, the window's length (s); its wait_ms and
-- reset_ms are both the time to the window's end, when every unit comes
-- back. The module interface (`decide`'s contract among it): script/mod.rs.
-- A count of this window and limit takes one
-- HINCRBY; the expiry and the other fields are written with the window's
-- first count or a conversion.
local limit = tonumber(ARGV[1])
local secs = math.floor(now / 1000000)
local len = tonumber(ARGV[2])
local start, finish = calendar_window(len and 'aligned' or ARGV[2], tonumber(ARGV[3]), secs, len)
local reset_ms = math.max(1, math.ceil((finish * 1000000 - now) / 1000))

-- The hash is read by HMGET, not in batch.lua's MGET.
local function read_keys(key, list, n)
  return n
end
local reads = 0

local function decide(key, cost)
  local state = redis.call('HMGET', key, 's', 'e', 'c', 'l', 'r')
  local count = 0
  local converted_in
  local current = false
  -- A count from another window is void: an earlier one (the key outlived
  -- its expiry by a tick), or a day that began with this month.
  if tonumber(state[1]) == start and tonumber(state[2]) == finish then
    count = tonumber(state[3]) or 0
    local l = tonumber(state[4])
    current = l == limit
    if l and l ~= limit and change_mode > 0 then
      local mode = 1
      if state[5] ~= tostring(start) and start <= changed_at then
        for j = 1, prev_n do
          if prev_l[j] == l then mode = change_mode end
        end
      end
      if mode == 3 then
        count = 0
      else
        count = math.ceil(converted(count, l, limit, mode) - 1e-9)
      end
      if mode ~= 1 then converted_in = start end
    end
  end
  if count + cost > limit then
    return 0, 0, reset_ms, reset_ms, finish - start
  end
  count = count + cost
  if current then
    redis.call('HINCRBY', key, 'c', cost)
  elseif converted_in then
    redis.call('HSET', key, 's', start, 'e', finish, 'c', count, 'l', limit, 'r', converted_in)
  else
    redis.call('HSET', key, 's', start, 'e', finish, 'c', count, 'l', limit)
  end
  -- A second past the edge: the check above, not the expiry, ends the window.
  if not current then redis.call('PEXPIREAT', key, finish * 1000 + 1000) end
  -- For grant.lua, the time left in the window.
  return 1, limit - count, reset_ms, reset_ms, finish - start, reset_ms
end

-- The control handle's (control.lua): what a one-unit request would be
-- told, and `units` spent (down to empty) or given back (up to whole). The
-- window's count and the limit it was counted under (this one by default).
local function counted(key)
  local state = redis.call('HMGET', key, 's', 'e', 'c', 'l')
  if tonumber(state[1]) == start and tonumber(state[2]) == finish then
    return tonumber(state[3]) or 0, tonumber(state[4]) or limit
  end
  return 0, limit
end

-- Units of this limit in the limit `l` a count was made under, as the next
-- decision reads it: proportionally, unless counts stay as counted (mode
-- 0, a `quota_fn` rule). Rounded against the caller.
local function scaled(units, l, up)
  if l == limit or change_mode == 0 then return units end
  local u = units * l / limit
  if up then return math.ceil(u - 1e-9) end
  return math.floor(u + 1e-9)
end

local function peek(key)
  local count, l = counted(key)
  if l ~= limit and change_mode > 0 then
    count = math.ceil(converted(count, l, limit, 1) - 1e-9)
  end
  local wait = 0
  if count >= limit then wait = reset_ms end
  return math.max(0, limit - count), wait, reset_ms
end

-- A refund of a charge in another window (its reset, `ends_in` ms from
-- now, is not this window's end) is void.
local function adjust(key, units, _, ends_in)
  if ends_in and math.abs(ends_in - reset_ms) * 2 > (finish - start) * 1000 then return true end
  local count, l = counted(key)
  -- Kept in the limit `l` it was counted under: a count of another limit
  -- still converts at its next decision.
  if units > 0 then units = scaled(units, l, true) else units = -scaled(-units, l, false) end
  count = math.max(0, math.min(l, count + units))
  -- A new window's count is of this limit.
  redis.call('HSET', key, 's', start, 'e', finish, 'c', count, 'l', l)
  redis.call('PEXPIREAT', key, finish * 1000 + 1000)
end

local function reset(key)
  redis.call('DEL', key)
end
