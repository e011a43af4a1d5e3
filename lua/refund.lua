-- refund.lua: gives back units a gateway leased and did not spend (limits with mode: leased).
-- Composed after prelude.lua; mirrors Algorithm::refund in src/limiter/algorithm/mod.rs.
--
-- KEYS[1] : the limit's state key
-- ARGV[1] : now in microseconds, or "" to read the clock from Redis TIME (production)
-- ARGV[2] : algorithm: gcra or fixed_window
-- ARGV[3] : gcra: the emission interval in us; fixed_window: unused
-- ARGV[4] : units to give back
-- Reply   : 1 if the state changed, 0 if there was nothing to give back to
--
-- gcra        : the TAT moves back by units * emission; a TAT no longer ahead of now is a full
--               bucket, the same as no key, so the key is deleted.
-- fixed_window: the count drops by units (never below 0) while the window is open; a closed
--               window has nothing to give back to.

local now = now_us(ARGV[1])
local algorithm, units = ARGV[2], tonumber(ARGV[4])
local key = KEYS[1]

if algorithm == 'gcra' then
  local tat = tonumber(redis.call('GET', key))
  if not tat then
    return 0
  end
  tat = tat - tonumber(ARGV[3]) * units
  if tat <= now then
    redis.call('DEL', key)
  else
    redis.call('SET', key, fmt(tat), 'PX', ceil_ms(tat - now))
  end
  return 1
elseif algorithm == 'fixed_window' then
  local stored = redis.call('HMGET', key, 'e', 'n')
  local e, n = tonumber(stored[1]), tonumber(stored[2])
  if not e or not n or now >= e then
    return 0
  end
  redis.call('HSET', key, 'n', fmt(math.max(n - units, 0)))
  return 1
end
return redis.error_reply('ERR sluice: refund does not apply to ' .. tostring(algorithm))
