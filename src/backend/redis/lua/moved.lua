-- A reload's conversion and the moves it leaves (quota_change.lua), over an
-- algorithm's `set_frame(limit, window_us, burst)` and `decide`, and the
-- moves it adds: `capacity()`, `counts` (its state counts whole units),
-- `absent(key)`, `movable(window_us)`, `move(from, l, w, b, mode, key)`
-- and `bury(from, tomb, ttl)`.
moves_of[#moves_of + 1] = function(m)
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

  -- A decision of `cost` units on `key`, whose value `v` is a tombstone:
  -- made at the end of its moves, in that state's quota, with the cost
  -- converted proportionally (exactly where the state is a time, rounded
  -- against the caller where it is a count: never a unit more) and
  -- `remaining` converted back.
  function m.follow(key, v, lock, cost, of_window)
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
    local allowed, remaining, wait, reset, extra = decide(target, lock, c, of_window)
    set_frame(own_l, own_w, own_b)
    if allowed == 1 then remaining = math.floor(remaining / ratio + 1e-9) end
    return allowed, remaining, wait, reset, extra
  end
end
