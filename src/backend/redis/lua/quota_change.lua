-- A quota change (`QuotaChange`): while a reload's conversion lasts, each
-- key comes with its state key under the rule's previous quota, and
-- `changed_from(i)` reads that quota's limit, window_us and burst and the
-- mode (1 proportional, 2 as is) from ARGV[i..i + 3] (batch.lua: 8, when
-- its ARGV[7] is 3; grant.lua: 10, with a KEYS[2]). `converted(used, from,
-- to)` is what `used` units of a capacity `from` become under `to`.
local old_limit, old_window, old_burst, change_mode

local function changed_from(i)
  old_limit, old_window = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
  old_burst, change_mode = tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
end

local function converted(used, from, to)
  used = math.min(math.max(used, 0), from)
  if change_mode == 1 then return used / from * to end
  return math.min(used, to)
end
