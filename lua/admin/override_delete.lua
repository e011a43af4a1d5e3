-- admin/override_delete.lua: the quota admin API's removal of an override
-- (src/edge/quota_admin/), atomic in Redis. Composed after prelude.lua (fmt, now_us),
-- admin/epoch.lua and admin/overrides.lua. Mirrors AdminBook::delete_override (src/limiter/admin/).
--
-- KEYS[1] : the overrides hash
-- KEYS[2] : the admin epoch key (one hash tag with KEYS[1])
-- ARGV[1] : now in microseconds, or "" to read Redis TIME (production)
-- ARGV[2] : the field
-- Reply   : the value removed, if it was in force, or false. Counts one more change in the
--           epoch when there was one to remove.
local now = now_us(ARGV[1])
if #KEYS ~= 2 then
  return redis.error_reply('ERR sluice: override_delete expects the overrides and epoch keys')
end
local previous = live(redis.call('HGET', KEYS[1], ARGV[2]), math.floor(now / 1000))
if redis.call('HDEL', KEYS[1], ARGV[2]) == 1 then
  announce(KEYS[2], now)
end
return previous or false
