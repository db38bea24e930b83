-- GCRA's and the token bucket's `migrate(key, old)`: a key's state is when
-- it is whole again, so the units it has not got back are that time over
-- the emission interval, under either quota. Runs only while the key has
-- no state of its own under the new quota: at its next decision. The old
-- state moves: read once, so a key whole again under the new quota is not
-- charged twice.
local function migrate(key, old)
  if redis.call('EXISTS', key) == 1 then return end
  local at = tonumber(redis.call('GET', old))
  if not at then return end
  redis.call('DEL', old)
  if at <= now then return end
  local new_interval = tonumber(ARGV[2]) / tonumber(ARGV[1])
  local used = converted((at - now) / (old_window / old_limit), old_burst, tonumber(ARGV[3]))
  if used <= 0 then return end
  local whole = now + used * new_interval
  redis.call('SET', key, string.format('%.17g', whole), 'PX', math.ceil((whole - now) / 1000))
end
