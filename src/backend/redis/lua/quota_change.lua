-- A quota change (`QuotaChange`, ADR 21 and 25). While a reload's
-- conversion lasts, each key comes with its state keys under the rule's
-- previous quotas, most recent first, and `changed_from(i)` reads from
-- ARGV[i..]: their count n, each one's limit, window_us and burst, the mode
-- (0 none, 1 proportional, 2 as is, 3 reset) and the reload's Redis-clock
-- second; it returns the index of the argument after them.
-- `converted(used, from, to, mode)` is what `used` units of a capacity
-- `from` become under `to`.
local own_l, own_w, own_b = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local prev_n, change_mode, changed_at = 0, 0, 0
local prev_l, prev_w, prev_b = {}, {}, {}

local function changed_from(i)
  prev_n = tonumber(ARGV[i])
  i = i + 1
  for j = 1, prev_n do
    prev_l[j], prev_w[j], prev_b[j] = tonumber(ARGV[i]), tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
    i = i + 3
  end
  change_mode, changed_at = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
  return i + 2
end

local function converted(used, from, to, mode)
  used = math.min(math.max(used, 0), from)
  if mode == 2 then return math.min(used, to) end
  return used / from * to
end

-- Moved states. The gateway that converts a key leaves, where each older
-- state was, a tombstone: '>' and the quota ("limit/window_us/burst") that
-- ends the key of the state it moved to, beside the old one. A gateway
-- still on an older quota follows it and decides in that state, converted
-- proportionally: every gateway counts one state.
-- Their functions are made on first use in a call, by the builders each
-- file adds to `moves_of`: a function a script defines costs every call,
-- and most calls move nothing.
local moves_of = {}
local made

local function moves()
  if not made then
    made = {}
    for _, add in ipairs(moves_of) do add(made) end
  end
  return made
end

moves_of[1] = function(m)
  function m.tomb_of(v)
    if v and string.byte(v) == 62 then return string.sub(v, 2) end
  end

  function m.spec_key(key, spec)
    return string.match(key, '^(.*):[^:]*$') .. ':' .. spec
  end

  function m.spec_quota(spec)
    local l, w, b = string.match(spec, '^(%d+)/(%d+)/(%d+)$')
    return tonumber(l), tonumber(w), tonumber(b)
  end

  -- The end of the moves from `key`, whose value is `v`: the key holding
  -- the state, and its quota's spec (nil: `key`'s own); nil for a loop.
  function m.resolve(key, v)
    local spec
    for _ = 1, 16 do
      local s = m.tomb_of(v)
      if not s then return key, spec end
      spec = s
      key = m.spec_key(key, s)
      v = redis.call('GET', key)
    end
  end

  -- How long a tombstone lasts: as long as the conversion on the gateway
  -- that wrote it (engine/quota_change.rs), ten minutes at least.
  function m.tomb_ms(l, w, b)
    return math.max(600000, 2 * math.ceil(w * math.max(1, b / l) / 1000))
  end
end
