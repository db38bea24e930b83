-- A reload's conversion and the moves it leaves, as functions of the table
-- `m` that `moves()` makes (script/sources.rs wraps this file, after the
-- algorithm's own moves), over the module interface (script/mod.rs).
--
-- The gateway that converts a key leaves, where each older state was, a
-- tombstone: '>' and the quota ("limit/window_us/burst") that ends the key
-- of the state it moved to, beside the old one. A gateway still on an
-- older quota follows it and decides in that state, converted
-- proportionally: every gateway counts one state.
function m.tomb_of(v)
  if v and string.byte(v) == 62 then return string.sub(v, 2) end
end

function m.spec_key(key, spec)
  return string.match(key, '^(.*):[^:]*$') .. ':' .. spec
end

function m.spec_quota(spec)
  local l, w, b = string.match(spec, '^(%d+)/(%d+)/(%d+)$')
  return tonumber(l), tonumber(w), tonumber(b)
end

-- The end of the moves from `key`, whose value is `v`: the key holding
-- the state, and its quota's spec (nil: `key`'s own); nil for a loop.
function m.resolve(key, v)
  local spec
  for _ = 1, 16 do
    local s = m.tomb_of(v)
    if not s then return key, spec end
    spec = s
    key = m.spec_key(key, s)
    v = redis.call('GET', key)
  end
end

-- How long a tombstone lasts: as long as the conversion on the gateway
-- that wrote it (engine/quota_change.rs), ten minutes at least.
function m.tomb_ms(l, w, b)
  return math.max(600000, 2 * math.ceil(w * math.max(1, b / l) / 1000))
end

-- Before `key`'s first decision under a quota a reload changed: when it
-- has no state yet, converts the state of the first of its previous
-- quotas' keys, KEYS[at], KEYS[at + 1]..., that holds one (at the end of
-- its moves), and leaves a tombstone pointing here at each of them and at
-- the end of their moves, so that gateways still on older quotas decide
-- here.
function m.migrate(key, at)
  if not m.absent(key) then return end
  local tomb = '>' .. string.match(key, ':([^:]*)$')
  local ttl = m.tomb_ms(own_l, own_w, own_b)
  for j = 1, prev_n do ttl = math.max(ttl, m.tomb_ms(prev_l[j], prev_w[j], prev_b[j])) end
  local moved = false
  for j = 1, prev_n do
    local old = KEYS[at + j - 1]
    local target, spec = m.resolve(old, redis.call('GET', old))
    local l, w, b, mode = prev_l[j], prev_w[j], prev_b[j], change_mode
    -- A state that another gateway moved: it converts proportionally.
    if spec then l, w, b = m.spec_quota(spec); mode = 1 end
    if m.movable(w) then
      if target and target ~= key then
        if not moved and mode ~= 3 then moved = m.move(target, l, w, b, mode, key) end
        m.bury(target, tomb, ttl)
      end
      if old ~= target then m.bury(old, tomb, ttl) end
    end
  end
end

-- A decision of `cost` units on `key`, whose value `v` is a tombstone (or
-- nothing this script wrote, refused):
-- made at the end of its moves, in that state's quota, with the cost
-- converted proportionally (exactly where the state is a time, rounded
-- against the caller where it is a count: never a unit more) and
-- `remaining` converted back.
function m.follow(key, v, cost, of_window)
  local target, spec = m.resolve(key, v)
  -- A loop of moves cannot be made; refuse rather than admit.
  if not target or not spec then return 0, 0, 1000, 1000 end
  local own = m.capacity()
  set_frame(m.spec_quota(spec))
  local ratio = m.capacity() / own
  local c = cost * ratio
  if m.counts then
    if cost > 0 then c = math.ceil(c - 1e-9) else c = -math.floor(-c + 1e-9) end
  end
  local allowed, remaining, wait, reset, window_s, left_ms, window_id = decide(target, c, of_window)
  set_frame(own_l, own_w, own_b)
  if allowed == 1 then remaining = math.floor(remaining / ratio + 1e-9) end
  return allowed, remaining, wait, reset, window_s, left_ms, window_id
end
