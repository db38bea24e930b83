-- The state of GCRA and the token bucket: one number, the time (us of
-- Redis time) the bucket is whole again. Prepended to their files.

-- What batch.lua reads ahead for a key in one MGET: its one number.
local function read_keys(key, list, n)
  list[n + 1] = key
  return n + 1
end
local reads = 1

-- The key's value: read ahead with the batch's others (`vals[at]`), or here.
local function value(key, vals, at)
  if vals then return vals[at] end
  return redis.call('GET', key)
end

-- Writes `at`, or nothing for a bucket whole already; the ms until whole.
local function store_at(key, at)
  local whole_ms = math.ceil((at - now) / 1000)
  if whole_ms > 0 then
    redis.call('SET', key, string.format('%.17g', at), 'PX', whole_ms)
  else
    redis.call('DEL', key)
  end
  return whole_ms
end
