-- Locks, around every rate script: the script before this one is the body
-- of `decide(cost)`, and `wide` says whether its reply carries a window length.
-- The lock and the denies counted toward one are keys of the rule and key
-- (KEYS[1] up to its hash tag's end), whatever the algorithm or quota.
-- ARGV[4]: the cost. ARGV[5..7]: lock after this many denies (0: no
-- lockout), within_ms, block_ms. ARGV[8..]: more costs, decided in turn
-- after the first as if each were its own call (a coalesced batch); their
-- replies follow the first's.
-- Appends to each reply `locked`: 1 when the key was locked already, 2 when
-- this deny locked it (wait_ms and reset_ms are then the lock's time left).
local tag = string.match(KEYS[1], '^(.*})')
local lock = tag .. ':lock'
local after = tonumber(ARGV[5])
local function one(cost)
  local left = redis.call('PTTL', lock)
  if left > 0 then
    if wide then return {0, 0, left, left, 0, 1} end
    return {0, 0, left, left, 1}
  end
  local r = decide(cost)
  local locked = 0
  if r[1] == 0 and after > 0 then
    local denies = tag .. ':denies'
    local n = redis.call('INCR', denies)
    if n == 1 then redis.call('PEXPIRE', denies, ARGV[6]) end
    if n >= after then
      redis.call('SET', lock, 1, 'PX', ARGV[7])
      redis.call('DEL', denies)
      r[3] = tonumber(ARGV[7])
      r[4] = r[3]
      locked = 2
    end
  end
  r[#r + 1] = locked
  return r
end
local out = one(tonumber(ARGV[4]))
for i = 8, #ARGV do
  local r = one(tonumber(ARGV[i]))
  for j = 1, #r do out[#out + 1] = r[j] end
end
return out
