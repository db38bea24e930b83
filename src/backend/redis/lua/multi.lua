-- Several rules' rate calls in one: `run` holds each rate script as a
-- function of its own KEYS and ARGV (script/sources.rs makes them), and
-- each call's reply follows its length in this script's, one flat list:
-- a client parses a nested reply several times slower. ARGV[1] is the
-- number of calls, then per call its script, its key count and its
-- argument count; then every call's arguments, in order, as KEYS holds
-- every call's keys.
local calls = tonumber(ARGV[1])
local k, a = 0, 1 + 3 * calls
local out, n = {}, 0
for c = 1, calls do
  local script = run[tonumber(ARGV[3 * c - 1])]
  local nk, na = tonumber(ARGV[3 * c]), tonumber(ARGV[3 * c + 1])
  local keys, argv = {}, {}
  for i = 1, nk do keys[i] = KEYS[k + i] end
  for i = 1, na do argv[i] = ARGV[a + i] end
  k, a = k + nk, a + na
  local reply = script(keys, argv)
  n = n + 1
  out[n] = #reply
  for i = 1, #reply do out[n + i] = reply[i] end
  n = n + #reply
end
return out
