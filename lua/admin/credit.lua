-- admin/credit.lua: the quota admin API's credit (src/edge/quota_admin/), atomic in Redis: units
-- given back to a limit's key, once per caller-supplied id. Composed after prelude.lua (fmt,
-- now_us, ceil_ms). Mirrors the in-process backend's credit (src/limiter/local.rs, credit_now).
--
-- KEYS[1] : a limit's state key
-- KEYS[2] : the credit's id key (the state key and a hash of the caller's id: the same hash
--           tag, one Cluster slot)
-- ARGV[1] : now in microseconds, or "" to read Redis TIME (production)
-- ARGV[2] : gcra or count (fixed_window, calendar)
-- ARGV[3] : the emission interval in us (gcra; else unused)
-- ARGV[4] : units
-- ARGV[5] : how long the id is remembered, in ms
-- Reply   : 1 when the key changed, 0 when there was nothing to credit, -1 when the id was
--           seen within ARGV[5] (nothing changes).
--
-- gcra : the TAT moves back by min(units * emission, TAT - now): never further than a full
--        bucket (a TAT no longer ahead of now is a full bucket, so the key is deleted).
-- count: the window's count drops by units, never below 0, while the window is open (a closed
--        window is already full again).
local now = now_us(ARGV[1])
local units, emission, remember = tonumber(ARGV[4]), tonumber(ARGV[3]), tonumber(ARGV[5])
if #KEYS ~= 2 or not units or units < 1 or not emission or not remember or remember < 1 then
  return redis.error_reply('ERR sluice: credit expects a state key, an id key, units and a memory')
end
if not redis.call('SET', KEYS[2], '1', 'NX', 'PX', remember) then
  return -1
end
if ARGV[2] == 'gcra' then
  local tat = tonumber(redis.call('GET', KEYS[1]))
  if not tat or tat <= now then
    return 0
  end
  tat = tat - math.min(emission * units, tat - now)
  if tat <= now then
    redis.call('DEL', KEYS[1])
  else
    redis.call('SET', KEYS[1], fmt(tat), 'PX', ceil_ms(tat - now))
  end
  return 1
end
local stored = redis.call('HMGET', KEYS[1], 'e', 'n')
local e, n = tonumber(stored[1]), tonumber(stored[2])
if not e or not n or now >= e or n == 0 then
  return 0
end
redis.call('HSET', KEYS[1], 'n', fmt(math.max(n - units, 0)))
return 1
