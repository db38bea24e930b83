-- The control handle's operations on one key, over an algorithm's module
-- (clock.lua, quota_change.lua and the algorithm's file come first, as in
-- its rate script, whose `peek(key)`, `adjust(key, units, of_window,
-- ends_in)` and `reset(key)` this calls; the rolling algorithms' moves too).
-- KEYS[1]: the algorithm's key, as the rate script names it; the lock and
-- the lockout's deny count are the rule and key's own (`…}:lock`,
-- `…}:denies`).
-- ARGV: the rate script's three (limit, window_us, burst; the calendar's
-- limit, period or aligned length, utc_offset_s), then op ('adjust' | 'reset' | 'block' |
-- 'unblock'), units (adjust: > 0 spends, < 0 gives back, 0 reads),
-- block_ms, the window an adjustment is for (0: none; a lease's leftovers
-- name the window they were granted in), the conversion mode of a count
-- of another limit (quota_change.lua's: 1 proportional, 0 as counted) and,
-- for a refund, when the window it was charged in ends, in ms from now:
-- the reset its decision was told, less the time since ('' for none). A
-- return to a window that has ended, or a refund whose window is not the
-- current one (its reset now differs by more than half a window from the
-- one a charge would be told now), is void: it would credit a window that
-- never spent it.
-- KEYS[2...]: while a quota change converts, the key's states under the
-- rule's previous quotas (quota_change.lua, from ARGV[10...]), converted
-- first as before a decision, so an operation on a key this gateway has
-- not decided since its reload never starts it afresh.
-- A key a reload moved (a tombstone, ADR 25) is read and changed at the
-- end of its moves, in that state's quota, its units converted as a
-- decision's cost is; the tombstone stays for the gateways it leads.
-- Returns {remaining, wait_ms, reset_ms, locked_ms, void}: what a request
-- of one unit would be told now, without spending it, and 1 when the
-- adjustment was void.
local op = ARGV[4]
local units = tonumber(ARGV[5])
local of_window = tonumber(ARGV[7])
if of_window == 0 then of_window = nil end
change_mode = tonumber(ARGV[8])
local ends_in = tonumber(ARGV[9])
local tag = string.match(KEYS[1], '^(.*})')
local lock = tag .. ':lock'
if op == 'block' then
  redis.call('SET', lock, 1, 'PX', ARGV[6])
  redis.call('DEL', tag .. ':denies')
  return {0, 0, 0, tonumber(ARGV[6]), 0}
end
if op == 'unblock' or op == 'reset' then
  redis.call('DEL', lock, tag .. ':denies')
end
if KEYS[2] then
  changed_from(10)
  moves().migrate(KEYS[1], 2)
end
local key, ratio = KEYS[1], 1
if moves then
  local m = moves()
  local v = redis.call('GET', key)
  if m.tomb_of(v) then
    local target, spec = m.resolve(key, v)
    -- A loop of moves: nothing to change, nothing left.
    if not target or not spec then return {0, 1000, 1000, 0, 1} end
    local own = m.capacity()
    set_frame(m.spec_quota(spec))
    ratio = m.capacity() / own
    key = target
    local u = units * ratio
    if not m.counts then
      units = u
    elseif units > 0 then
      units = math.ceil(u - 1e-9)
    else
      units = -math.floor(-u + 1e-9)
    end
  end
end
local void = false
if op == 'reset' then
  reset(key)
elseif op == 'adjust' and units ~= 0 then
  void = adjust(key, units, of_window, ends_in)
end
local remaining, wait, reset_ms = peek(key)
if remaining > 0 then wait = 0 end
remaining = math.floor(remaining / ratio + 1e-9)
return {remaining, wait, reset_ms, math.max(0, redis.call('PTTL', lock)), void and 1 or 0}
