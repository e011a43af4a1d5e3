-- admin/override_restore.lua: an override written back where Redis lost it (a restart without
-- persistence, a flush, a failover to a lagging replica) and a gateway holds what was in force
-- (src/runtime/overrides.rs), atomic in Redis. Composed after prelude.lua (fmt, now_us),
-- admin/epoch.lua and admin/overrides.lua. Mirrors AdminBook::restore_override
-- (src/limiter/admin/).
--
-- KEYS and ARGV as override_put.lua's, but ARGV[4]: what the override had left, in ms.
-- Writes only where the field holds no override in force.
-- Reply : 1 written (one more change in the epoch), 0 one is in force (another gateway wrote
--         it back, or it was set anew: nothing changes), -1 the hash holds ARGV[5] overrides
--         in force.
local now = now_us(ARGV[1])
local now_ms = math.floor(now / 1000)
local lifetime, most = tonumber(ARGV[4]), tonumber(ARGV[5])
if #KEYS ~= 2 or not lifetime or lifetime < 1 or not most then
  return redis.error_reply('ERR sluice: override_restore expects a field, a value, a lifetime and a bound')
end
if live(redis.call('HGET', KEYS[1], ARGV[2]), now_ms) then
  return 0
end
if not has_room(KEYS[1], most, now_ms) then
  return -1
end
store(KEYS[1], ARGV[2], ARGV[3], lifetime, now_ms)
announce(KEYS[2], now)
return 1
