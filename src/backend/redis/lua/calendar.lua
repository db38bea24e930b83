-- Calendar windows on seconds since the epoch, the sums of
-- src/quota/calendar.rs (Howard Hinnant's days_from_civil); a test runs
-- both over the same instants. Prepended to the scripts that use it.
local function first_of_month(y, m)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local mp = (m + 9) % 12
  local doy = math.floor((153 * mp + 2) / 5)
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
  return era * 146097 + doe - 719468
end

local function year_month(days)
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400
  if m <= 2 then y = y + 1 end
  return y, m
end

-- The window of `period` ('day', 'month' or 'aligned', whose length is
-- `len` seconds) at `offset` seconds east of UTC that holds `now`: its
-- start and end, in seconds since the epoch.
local function calendar_window(period, offset, now, len)
  if period == 'aligned' then
    local start = math.floor((now + offset) / len) * len
    return start - offset, start + len - offset
  end
  local day = math.floor((now + offset) / 86400)
  local first, next_first = day, day + 1
  if period == 'month' then
    local y, m = year_month(day)
    first = first_of_month(y, m)
    if m == 12 then next_first = first_of_month(y + 1, 1) else next_first = first_of_month(y, m + 1) end
  end
  return first * 86400 - offset, next_first * 86400 - offset
end
