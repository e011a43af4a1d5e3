-- refund.lua: gives back units a gateway leased and did not spend (limits with mode: leased).
-- Composed after prelude.lua; mirrors Algorithm::refund in src/limiter/algorithm/mod.rs.
--
-- KEYS[1] : the limit's state key
-- ARGV[1] : now in microseconds, or "" to read the clock from Redis TIME (production)
-- ARGV[2] : algorithm: gcra or fixed_window
-- ARGV[3] : gcra: the emission interval in us; fixed_window: unused
-- ARGV[4] : units to give back
-- ARGV[5] : the mark the call that took them replied (check.lua): gcra, the TAT it wrote;
--           fixed_window, the end of the window it counted them in
-- Reply   : 1 if the state changed, 0 if there was nothing to give back to
--
-- A refund never gives back units another gateway consumed meanwhile:
-- gcra        : the units taken sit just before the mark on the TAT's timeline, and the part
--               of them time has not yet drained is mark - now: the TAT moves back by
--               min(units * emission, mark - now), never more. Whatever others consumed since
--               stays ahead of now. A TAT no longer ahead of now is a full bucket, the same as
--               no key, so the key is deleted.
-- fixed_window: the count drops by units (never below 0) while the window the units were
--               counted in is still the key's window (its end equals the mark); any other
--               window has nothing of them to give back.

local now = now_us(ARGV[1])
local algorithm, units, mark = ARGV[2], tonumber(ARGV[4]), tonumber(ARGV[5])
local key = KEYS[1]
if not units or not mark then
  return redis.error_reply('ERR sluice: refund expects units and a mark')
end

if algorithm == 'gcra' then
  local tat = tonumber(redis.call('GET', key))
  local credit = math.min(tonumber(ARGV[3]) * units, mark - now)
  if not tat or credit <= 0 then
    return 0
  end
  tat = tat - credit
  if tat <= now then
    redis.call('DEL', key)
  else
    redis.call('SET', key, fmt(tat), 'PX', ceil_ms(tat - now))
  end
  return 1
elseif algorithm == 'fixed_window' then
  local stored = redis.call('HMGET', key, 'e', 'n')
  local e, n = tonumber(stored[1]), tonumber(stored[2])
  if not e or not n or now >= e or e ~= mark then
    return 0
  end
  redis.call('HSET', key, 'n', fmt(math.max(n - units, 0)))
  return 1
end
return redis.error_reply('ERR sluice: refund does not apply to ' .. tostring(algorithm))
