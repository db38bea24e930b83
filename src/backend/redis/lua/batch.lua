-- Decides a batch: each request in turn, as if each were its own call
-- (clock.lua and an algorithm's `decide(key, lock, cost)` come first, and
-- `wide` says whether it returns a window length as a fifth value).
-- KEYS: for each key of the batch, once, its state key then its lock key
-- (the rule and key's own, whatever the algorithm or quota: declared, and
-- not built here, where each string costs). ARGV[4..6]: lock after this
-- many denies (0: no lockout), within_ms, block_ms. ARGV[7..]: pairs (key
-- number k, its keys KEYS[2k - 1] and KEYS[2k]; cost), in arrival order.
-- Returns each request's allowed, remaining, wait_ms, reset_ms (window_s),
-- then `locked`: 1 when the key was locked already, 2 when this deny locked
-- it (wait_ms and reset_ms are then the lock's time left).
local after = tonumber(ARGV[4])
local out = {}
local n = 0
for i = 7, #ARGV, 2 do
  local k = 2 * tonumber(ARGV[i])
  local lock = KEYS[k]
  local allowed, remaining, wait, reset, window_s = decide(KEYS[k - 1], lock, tonumber(ARGV[i + 1]))
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
