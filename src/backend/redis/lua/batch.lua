-- Decides a batch: each request in turn, as if each were its own call,
-- over an algorithm's module (script/mod.rs), with `wide` set when the
-- reply carries the window length its `decide` returns as a fifth value
-- (a calendar month's: a day's and an aligned window's are the quota's).
-- Its KEYS and ARGV are written, and described, by script/rate.rs's
-- `rate`: per key its state, its lock (ARGV[4] = 1), its states under
-- previous quotas (ARGV[8] keys per key); the lockout in ARGV[5..7];
-- `changed_from` from ARGV[9]; then (key number, cost) pairs, or none when
-- each key is decided once for one unit (read ahead in one MGET).
-- Returns for each request its code, wait_ms and reset_ms (and window_s
-- when wide):
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
