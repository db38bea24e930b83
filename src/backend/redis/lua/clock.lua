-- Redis time, read once per call: clients' clocks disagree, and every
-- decision of a batch is made at the same instant.
local now
do
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local now_ms = math.floor(now / 1000)
