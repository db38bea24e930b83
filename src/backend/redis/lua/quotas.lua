-- The quotas a fleet has in play for one rule (ADR 33): a hash, a field
-- per state key suffix (`gcra:10/600000000/10`), each "first_ms until_ms"
-- on Redis time: when a gateway first counted under it, and until when a
-- state under it may still matter (its last gateway's announcement plus
-- its conversion time). A gateway that starts with other rules converts
-- from the quotas first seen before its own, as a reload would.
-- KEYS[1]: the record. ARGV: this gateway's suffix and its conversion
-- time (ms). Returns the live entries, this one last, as flat triples
-- (suffix, first_ms, until_ms), then Redis time in ms, all as strings.
local key, own, ttl = KEYS[1], ARGV[1], tonumber(ARGV[2])
local all = redis.call('HGETALL', key)
local out, n, last, mine = {}, 0, now_ms + ttl, now_ms
for i = 1, #all, 2 do
  local first, till = string.match(all[i + 1], '^(%d+) (%d+)$')
  first, till = tonumber(first), tonumber(till)
  if not till or till <= now_ms then
    redis.call('HDEL', key, all[i])
  elseif all[i] == own then
    mine = first
  else
    out[n + 1], out[n + 2], out[n + 3] = all[i], string.format('%d', first), string.format('%d', till)
    n = n + 3
    last = math.max(last, till)
  end
end
redis.call('HSET', key, own, string.format('%d %d', mine, now_ms + ttl))
redis.call('PEXPIRE', key, last - now_ms)
local function int(v) return string.format('%d', v) end
out[n + 1], out[n + 2], out[n + 3], out[n + 4] = own, int(mine), int(now_ms + ttl), int(now_ms)
return out
