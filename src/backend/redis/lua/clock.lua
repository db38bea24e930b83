-- Redis time, read once per call: clients' clocks disagree, and every
-- decision of a batch is made at the same instant.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now / 1000)
-- Set by a window's `decide`, for grant.lua: the time left in its window,
-- and the window's name (the fixed window's end, the sliding window's index).
local left_ms, window_id
