-- Several rules' rate calls in one: `run` holds each rate script as a
-- function of its own KEYS and ARGV (script/sources.rs makes them). The
-- reply is one string, each call's values separated by spaces and the
-- calls by `;`: redis-rs parses each value of a list on its own, at about
-- a thousand instructions each, and a string once. ARGV[1] is the
-- number of calls, then per call its script, its key count and its
-- arguments in one, each followed by a space (redis-rs frames each
-- argument of a command on its own, at a few hundred instructions); KEYS
-- holds every call's keys, in order.
local calls = tonumber(ARGV[1])
local k = 0
local out = {}
for c = 1, calls do
  local script = run[tonumber(ARGV[3 * c - 1])]
  local nk = tonumber(ARGV[3 * c])
  local keys, argv, n = {}, {}, 0
  for i = 1, nk do keys[i] = KEYS[k + i] end
  for v in string.gmatch(ARGV[3 * c + 1], '%S+') do
    n = n + 1
    argv[n] = v
  end
  k = k + nk
  out[c] = table.concat(script(keys, argv), ' ')
end
return table.concat(out, ';')
