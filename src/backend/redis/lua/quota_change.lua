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
local prev_l, prev_w, prev_b

local function changed_from(i)
  prev_n = tonumber(ARGV[i])
  i = i + 1
  if prev_n > 0 then prev_l, prev_w, prev_b = {}, {}, {} end
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

-- Moved states (moved.lua): made on first use in a call, by `moves()`; a
-- function a script defines is made again at every call, and most calls
-- move nothing.
local moves, made
