-- Decides a batch: each request in turn, as if each were its own call
-- (clock.lua, quota_change.lua and an algorithm's `decide`, `read_keys`
-- and `reads`, with moved.lua's `migrate(key, at)` for the rolling ones,
-- come first, and `wide` says whether `decide` returns a window length as
-- a fifth value).
-- KEYS: for each key of the batch, once, its state key, then its lock key
-- when ARGV[4] is 1 (a rule that can be locked: declared, not built here,
-- where each string costs), then, when ARGV[8] (the keys per key) says
-- so, its state keys under the rule's previous quotas (see
-- quota_change.lua), which `migrate` converts before the key's first
-- decision. ARGV[5..7]: lock after this many denies (0: no lockout),
-- within_ms, block_ms. ARGV[9..]: the previous quotas (`changed_from`),
-- then pairs (key number k, from 1; cost) in arrival order, or nothing
-- when each key is decided once, for one unit, in order: then, outside a
-- conversion, the states and locks are read ahead in one MGET.
-- Returns for each request its code, wait_ms and reset_ms (and window_s):
-- the code is `remaining` (0 or more) on an allow, -1 on a deny, -2 when
-- the key was locked already and -3 when this deny locked it (wait_ms and
-- reset_ms are then the lock's time left). On a deny wait_ms is the
-- retry-after; on an allow, the wait until one more unit fits.
local locks = ARGV[4] == '1'
local after = tonumber(ARGV[5])
local stride = tonumber(ARGV[8])
local items = changed_from(9)
local converting = stride > (locks and 2 or 1)
local once = items > #ARGV
local ahead = once and not converting
local keys = #KEYS / stride
local vals
if ahead and (reads > 0 or locks) then
  local list, m = {}, 0
  for k = 1, keys do
    m = read_keys(KEYS[stride * (k - 1) + 1], list, m)
    if locks then
      m = m + 1
      list[m] = KEYS[stride * k]
    end
  end
  vals = redis.call('MGET', unpack(list))
end
local per = reads + (locks and 1 or 0)
local out = {}
local n = 0
for r = 1, once and keys or (#ARGV - items + 1) / 2 do
  local k, cost
  if once then
    k, cost = r, 1
  else
    local i = items + 2 * (r - 1)
    k, cost = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
  end
  local first = stride * (k - 1)
  local key = KEYS[first + 1]
  local code, wait, reset, window_s = -2, 0, 0, 0
  local held = false
  if locks then
    local lock = KEYS[first + 2]
    -- Read ahead, a lock costs a PTTL only where there is one.
    if not vals or vals[per * k] then
      local ttl = redis.call('PTTL', lock)
      if ttl > 0 then
        held, wait, reset = true, ttl, ttl
      end
    end
  end
  if not held then
    if converting then moves().migrate(key, first + (locks and 3 or 2)) end
    local allowed, remaining
    allowed, remaining, wait, reset, window_s = decide(key, cost, nil, vals, per * (k - 1) + 1)
    if allowed == 1 then
      code = remaining
    else
      code = -1
      if after > 0 and locks then
        -- The denies counted toward a lock: beside it (`…}:lock` → `…}:denies`).
        local lock = KEYS[first + 2]
        local denies = string.sub(lock, 1, -5) .. 'denies'
        local d = redis.call('INCR', denies)
        if d == 1 then redis.call('PEXPIRE', denies, ARGV[6]) end
        if d >= after then
          redis.call('SET', lock, 1, 'PX', ARGV[7])
          redis.call('DEL', denies)
          wait = tonumber(ARGV[7])
          reset = wait
          code = -3
        end
      end
    end
  end
  out[n + 1], out[n + 2], out[n + 3] = code, wait, reset
  n = n + 3
  if wide then
    n = n + 1
    out[n] = window_s or 0
  end
end
return out
