-- A fixed window is named by its end (ms of Redis time), which `now_ms +
-- PTTL` gives to a millisecond or two: whether the window named
-- `of_window` is the one of `window_ms` ending `ttl` after `now_ms`.
-- Windows under 5 ms are too close to tell apart: never. Prepended to the
-- scripts that give units back to a window.
local function same_window(of_window, window_ms, now_ms, ttl)
  return window_ms >= 5 and math.abs(of_window - (now_ms + ttl)) <= 2
end
