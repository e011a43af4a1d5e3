-- admin/overrides.lua: the overrides hash, shared by override_put.lua, override_restore.lua
-- and override_delete.lua (composed after prelude.lua and admin/epoch.lua).
--
-- A field names a route, a limit and a consumer; its value is "<expiry in ms on Redis's
-- clock> <JSON>". The hash lives as long as its longest override; nothing here lives forever.

-- The live value of a stored override (without its expiry) at `now_ms`, and the ms it has
-- left; nil when there is none or it has expired.
local function live(stored, now_ms)
  local space = stored and string.find(stored, ' ', 1, true)
  if not space then
    return nil, 0
  end
  local left = tonumber(string.sub(stored, 1, space - 1)) - now_ms
  if left <= 0 then
    return nil, 0
  end
  return string.sub(stored, space + 1), left
end

-- Whether the overrides hash at `key` has room for one more (the expired ones at `now_ms`
-- dropped when it holds `most`).
local function has_room(key, most, now_ms)
  if redis.call('HLEN', key) < most then
    return true
  end
  local all = redis.call('HGETALL', key)
  for i = 1, #all, 2 do
    if not live(all[i + 1], now_ms) then
      redis.call('HDEL', key, all[i])
    end
  end
  return redis.call('HLEN', key) < most
end

-- Writes `value` at `field` of the hash at `key`, for `lifetime` ms from `now_ms`; the hash
-- lives at least as long.
local function store(key, field, value, lifetime, now_ms)
  redis.call('HSET', key, field, fmt(now_ms + lifetime) .. ' ' .. value)
  if redis.call('PTTL', key) < lifetime then
    redis.call('PEXPIRE', key, lifetime)
  end
end
