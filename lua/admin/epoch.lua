-- admin/epoch.lua: the admin epoch, the count of changes to the quota admin tables that tells
-- every gateway to read them again. Composed after prelude.lua (fmt) into the admin scripts
-- that change something every gateway must learn of: override_put.lua, override_restore.lua,
-- override_delete.lua and announce.lua (src/limiter/redis/script.rs).
--
-- Every gateway reads the epoch every second (a GET) and, when it changed, the overrides
-- (HGETALL and TIME: plain reads, no script) and forgets the denials it cached. The epoch lives
-- ANNOUNCED_MS (src/runtime/overrides.rs's EPOCH_LIFETIME_US); a lapsed epoch reads 0, a
-- change too.

local ANNOUNCED_MS = 30 * 24 * 3600 * 1000

-- Counts one more change in the epoch at `key`, at `now` in microseconds: its new value, past
-- the last and at least the time, so no value comes back after a restart, a flush or a
-- failover that lost the last one (a gateway that saw it would take the same value for no
-- change).
local function announce(key, now)
  local epoch = math.max((tonumber(redis.call('GET', key)) or 0) + 1, now)
  redis.call('SET', key, fmt(epoch), 'PX', ANNOUNCED_MS)
  return epoch
end
