-- admin.lua: the quota admin API's writes (src/edge/quota_admin.rs), each one atomic in Redis.
-- Composed after prelude.lua (fmt, now_us). Mirrors src/limiter/admin.rs's in-process book.
--
-- ARGV[1] : the operation; ARGV[2]: now in microseconds, or "" to read Redis TIME (production)
--
-- reset           KEYS: limits' state keys. Deletes them: a deleted key is a full quota, for
--                 every algorithm. Reply: how many existed.
-- credit          KEYS[1]: a limit's state key, KEYS[2]: the credit's id key (the state key and
--                 a hash of the caller's id: the same hash tag, one Cluster slot).
--                 ARGV[3]: gcra or count (fixed_window, calendar), ARGV[4]: the emission
--                 interval in us (gcra; else unused), ARGV[5]: units, ARGV[6]: how long the id
--                 is remembered, in ms.
--                 A credit whose id was seen within ARGV[6] changes nothing and replies -1.
--                 gcra : the TAT moves back by min(units * emission, TAT - now): never further
--                        than a full bucket (a TAT no longer ahead of now is a full bucket, so
--                        the key is deleted).
--                 count: the window's count drops by units, never below 0, while the window is
--                        open (a closed window is already full again).
--                 Reply: 1 when the key changed, 0 when there was nothing to credit, -1 repeated.
-- override_put    KEYS[1]: the overrides hash, KEYS[2]: the admin epoch key (one hash tag).
--                 ARGV[3]: the field (which route, limit and consumer), ARGV[4]: the override
--                 (JSON), ARGV[5]: its lifetime in ms, ARGV[6]: the most overrides the hash
--                 may hold. Reply: {1, the previous value in force or ""}, or {0, ""} when the
--                 hash holds ARGV[6] overrides in force (nothing is written). The value stored
--                 is "<expiry in ms on Redis's clock> <JSON>"; the expired ones are dropped when
--                 the hash is full. Counts one more change in the epoch.
-- override_restore KEYS and ARGV as override_put (ARGV[5]: what the override had left, in ms):
--                 writes an override back only where its field holds none in force — Redis
--                 lost the table (a restart without persistence, a flush, a failover to a
--                 lagging replica) and a gateway holds what was in force. Reply: 1 written
--                 (one more change in the epoch), 0 one is in force (another gateway wrote it
--                 back, or it was set anew: nothing changes), -1 the hash holds ARGV[6]
--                 overrides in force.
-- override_delete KEYS[1]: the overrides hash, KEYS[2]: the admin epoch key. ARGV[3]: the
--                 field. Reply: the value removed, if it was in force, or false. Counts one
--                 more change in the epoch when there was one to remove.
-- announce        KEYS[1]: the admin epoch key: counts one more reset or credit. Reply: the
--                 epoch, which only grows (see `announce` below).
--
-- Every gateway reads the epoch every second (a GET) and, when it changed, the overrides
-- (HGETALL and TIME: plain reads, no script) and forgets the denials it cached. The epoch lives
-- ANNOUNCED_MS; a lapsed epoch reads 0, a change too.
--
-- The overrides hash lives as long as its longest override; nothing here lives forever.

local ANNOUNCED_MS = 30 * 24 * 3600 * 1000
local op = ARGV[1]
local now = now_us(ARGV[2])
local now_ms = math.floor(now / 1000)

-- The live value of a stored override (without its expiry), or nil when it has expired.
local function live(stored)
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

-- Counts one more change in the epoch at `key`: its new value, past the last and at least the
-- time in microseconds, so no value comes back after a restart, a flush or a failover that
-- lost the last one (a gateway that saw it would take the same value for no change).
local function announce(key)
  local epoch = math.max((tonumber(redis.call('GET', key)) or 0) + 1, now)
  redis.call('SET', key, fmt(epoch), 'PX', ANNOUNCED_MS)
  return epoch
end

-- Whether the overrides hash at `key` has room for one more (the expired ones dropped when
-- it holds `most`).
local function has_room(key, most)
  if redis.call('HLEN', key) < most then
    return true
  end
  local all = redis.call('HGETALL', key)
  for i = 1, #all, 2 do
    if not live(all[i + 1]) then
      redis.call('HDEL', key, all[i])
    end
  end
  return redis.call('HLEN', key) < most
end

if op == 'reset' then
  local existed = 0
  for i = 1, #KEYS do
    existed = existed + redis.call('DEL', KEYS[i])
  end
  return existed
elseif op == 'credit' then
  local units, emission, remember = tonumber(ARGV[5]), tonumber(ARGV[4]), tonumber(ARGV[6])
  if #KEYS ~= 2 or not units or units < 1 or not emission or not remember or remember < 1 then
    return redis.error_reply('ERR sluice: credit expects a state key, an id key, units and a memory')
  end
  if not redis.call('SET', KEYS[2], '1', 'NX', 'PX', remember) then
    return -1
  end
  if ARGV[3] == 'gcra' then
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
elseif op == 'override_put' or op == 'override_restore' then
  local lifetime, most = tonumber(ARGV[5]), tonumber(ARGV[6])
  if #KEYS ~= 2 or not lifetime or lifetime < 1 or not most then
    return redis.error_reply('ERR sluice: ' .. op .. ' expects a field, a value, a lifetime and a bound')
  end
  local previous = live(redis.call('HGET', KEYS[1], ARGV[3]))
  local restoring = op == 'override_restore'
  if restoring and previous then
    return 0
  end
  if not previous and not has_room(KEYS[1], most) then
    if restoring then
      return -1
    end
    return {0, ''}
  end
  redis.call('HSET', KEYS[1], ARGV[3], fmt(now_ms + lifetime) .. ' ' .. ARGV[4])
  if redis.call('PTTL', KEYS[1]) < lifetime then
    redis.call('PEXPIRE', KEYS[1], lifetime)
  end
  announce(KEYS[2])
  if restoring then
    return 1
  end
  return {1, previous or ''}
elseif op == 'override_delete' then
  if #KEYS ~= 2 then
    return redis.error_reply('ERR sluice: override_delete expects the overrides and epoch keys')
  end
  local previous = live(redis.call('HGET', KEYS[1], ARGV[3]))
  if redis.call('HDEL', KEYS[1], ARGV[3]) == 1 then
    announce(KEYS[2])
  end
  return previous or false
elseif op == 'announce' then
  return announce(KEYS[1])
end
return redis.error_reply('ERR sluice: unknown admin operation ' .. tostring(op))
