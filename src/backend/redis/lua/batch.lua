-- Decides a batch: each request in turn, as if each were its own call
-- (clock.lua and an algorithm's `decide(key, lock, cost)` come first, and
-- `wide` says whether its reply carries a window length).
-- KEYS: the state keys of the batch, each once. ARGV[4..6]: lock after
-- this many denies (0: no lockout), within_ms, block_ms. ARGV[7..]: pairs
-- (index into KEYS, cost), in arrival order.
-- The lock and the denies counted toward one are keys of the rule and key
-- (its state key up to the hash tag's end), whatever the algorithm or quota.
-- Returns each request's reply, concatenated, with `locked` appended: 1
-- when the key was locked already, 2 when this deny locked it (wait_ms and
-- reset_ms are then the lock's time left).
local after = tonumber(ARGV[4])
local locks = {}
local out = {}
for i = 7, #ARGV, 2 do
  local k = tonumber(ARGV[i])
  local key = KEYS[k]
  local tag = locks[k]
  if not tag then
    tag = string.match(key, '^(.*})')
    locks[k] = tag
  end
  local r, left = decide(key, tag .. ':lock', tonumber(ARGV[i + 1]))
  local locked = 0
  if not r then
    if wide then r = {0, 0, left, left, 0} else r = {0, 0, left, left} end
    locked = 1
  elseif r[1] == 0 and after > 0 then
    local denies = tag .. ':denies'
    local n = redis.call('INCR', denies)
    if n == 1 then redis.call('PEXPIRE', denies, ARGV[5]) end
    if n >= after then
      redis.call('SET', tag .. ':lock', 1, 'PX', ARGV[6])
      redis.call('DEL', denies)
      r[3] = tonumber(ARGV[6])
      r[4] = r[3]
      locked = 2
    end
  end
  for j = 1, #r do out[#out + 1] = r[j] end
  out[#out + 1] = locked
end
return out
