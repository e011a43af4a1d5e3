-- admin/override_put.lua: the quota admin API's override (src/edge/quota_admin/), atomic in
-- Redis: an override set, or replaced, for a while. Composed after prelude.lua (fmt, now_us),
-- admin/epoch.lua and admin/overrides.lua. Mirrors AdminBook::put_override (src/limiter/admin/).
--
-- KEYS[1] : the overrides hash
-- KEYS[2] : the admin epoch key (one hash tag with KEYS[1])
-- ARGV[1] : now in microseconds, or "" to read Redis TIME (production)
-- ARGV[2] : the field (which route, limit and consumer)
-- ARGV[3] : the override (JSON)
-- ARGV[4] : its lifetime in ms
-- ARGV[5] : the most overrides the hash may hold
-- Reply   : {1, the previous value in force or ""}, or {0, ""} when the hash holds ARGV[5]
--           overrides in force (nothing is written; the expired ones are dropped when the hash
--           is full). Counts one more change in the epoch when it writes.
local now = now_us(ARGV[1])
local now_ms = math.floor(now / 1000)
local lifetime, most = tonumber(ARGV[4]), tonumber(ARGV[5])
if #KEYS ~= 2 or not lifetime or lifetime < 1 or not most then
  return redis.error_reply('ERR sluice: override_put expects a field, a value, a lifetime and a bound')
end
local previous = live(redis.call('HGET', KEYS[1], ARGV[2]), now_ms)
if not previous and not has_room(KEYS[1], most, now_ms) then
  return {0, ''}
end
store(KEYS[1], ARGV[2], ARGV[3], lifetime, now_ms)
announce(KEYS[2], now)
return {1, previous or ''}
