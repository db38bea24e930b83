-- Several rules' rate calls in one: `run` holds each rate script as a
-- function of its own KEYS and ARGV (script/sources.rs makes them). The
-- reply is one string, each call's values separated by spaces and the
-- calls by `;`: redis-rs parses each value of a list on its own, at about
-- a thousand instructions each, and a string once. ARGV[1] is the
-- number of calls, then per call its script, its key count and its
-- argument count; then every call's arguments, in order, as KEYS holds
-- every call's keys.
local calls = tonumber(ARGV[1])
local k, a = 0, 1 + 3 * calls
local out = {}
for c = 1, calls do
  local script = run[tonumber(ARGV[3 * c - 1])]
  local nk, na = tonumber(ARGV[3 * c]), tonumber(ARGV[3 * c + 1])
  local keys, argv = {}, {}
  for i = 1, nk do keys[i] = KEYS[k + i] end
  for i = 1, na do argv[i] = ARGV[a + i] end
  k, a = k + nk, a + na
  out[c] = table.concat(script(keys, argv), ' ')
end
return table.concat(out, ';')
