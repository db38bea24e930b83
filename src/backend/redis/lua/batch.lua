-- Decides a batch: each request in turn, as if each were its own call
-- (clock.lua, quota_change.lua and an algorithm's `decide(key, lock,
-- cost)`, with moved.lua's `migrate(key, at)` for the rolling ones, come
-- first, and `wide` says whether `decide` returns a window length as a
-- fifth value).
-- KEYS: for each key of the batch, once, its state key then its lock key
-- (the rule and key's own, whatever the algorithm or quota: declared, and
-- not built here, where each string costs), then, when ARGV[7] (the stride)
-- is above 2, its state keys under the rule's previous quotas (see
-- quota_change.lua), which `migrate` converts before the key's first
-- decision. ARGV[4..6]: lock after this many denies (0: no lockout),
-- within_ms, block_ms. ARGV[8..]: the previous quotas (`changed_from`),
-- then pairs (key number k, its keys KEYS[stride * (k - 1) + 1...]; cost),
-- in arrival order.
-- Returns each request's allowed, remaining, wait_ms, reset_ms (window_s),
-- then `locked`: 1 when the key was locked already, 2 when this deny locked
-- it (wait_ms and reset_ms are then the lock's time left).
local after = tonumber(ARGV[4])
local stride = tonumber(ARGV[7])
local items = changed_from(8)
local out = {}
local n = 0
for i = items, #ARGV, 2 do
  local first = stride * (tonumber(ARGV[i]) - 1)
  local lock = KEYS[first + 2]
  if stride > 2 then moves().migrate(KEYS[first + 1], first + 3) end
  local allowed, remaining, wait, reset, window_s = decide(KEYS[first + 1], lock, tonumber(ARGV[i + 1]))
  local locked = 0
  if not allowed then
    -- Locked: the second value is the lock's time left.
    allowed, wait, reset, window_s, locked = 0, remaining, remaining, 0, 1
    remaining = 0
  elseif allowed == 0 and after > 0 then
    -- The denies counted toward a lock: beside it (`…}:lock` → `…}:denies`).
    local denies = string.sub(lock, 1, -5) .. 'denies'
    local d = redis.call('INCR', denies)
    if d == 1 then redis.call('PEXPIRE', denies, ARGV[5]) end
    if d >= after then
      redis.call('SET', lock, 1, 'PX', ARGV[6])
      redis.call('DEL', denies)
      wait = tonumber(ARGV[6])
      reset = wait
      locked = 2
    end
  end
  out[n + 1], out[n + 2], out[n + 3], out[n + 4] = allowed, remaining, wait, reset
  n = n + 4
  if wide then
    n = n + 1
    out[n] = window_s
  end
  n = n + 1
  out[n] = locked
end
return out
