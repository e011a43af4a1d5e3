-- settle.lua: settles units that earlier calls (check.lua) took, on the keys of one request:
-- gives back what was not spent (a lease returned, a shaped request whose client left, a
-- response that cost less than its estimate) or charges what was spent beyond it (a response
-- that cost more: limits priced by the response, `cost_from_response`).
-- Composed after prelude.lua, gcra.lua and fixed_window.lua: a charge is written by the same
-- commit functions as a decision. Mirrors Algorithm::settle in src/limiter/algorithm/mod.rs.
--
-- KEYS    : the state keys, one per change (the keys of one request share one hash tag, so one
--           Cluster slot)
-- ARGV[1] : now in microseconds, or "" to read the clock from Redis TIME (production)
-- then 4 per key, in KEYS order:
--           algorithm: gcra, fixed_window or calendar (giving back only); gcra_lease to give
--                      back a lease's unspent GCRA units (giving back only, see below)
--           param: gcra, the emission interval in us; fixed_window, the window length in us;
--                  calendar, unused (1)
--           change: units; < 0 gives them back, > 0 charges them
--           mark: giving back, the mark the call that took the units replied (check.lua): gcra,
--                 the TAT it wrote; fixed_window and calendar, the end of the window or period
--                 it counted them in. Unused when charging.
-- Reply   : how many keys changed
--
-- Giving back never gives back units another gateway consumed meanwhile:
-- gcra        : the units taken sit just before the mark on the TAT's timeline, and the part
--               of them time has not yet drained is mark - now: the TAT moves back by
--               min(units * emission, mark - now), never more. Whatever others consumed since
--               stays ahead of now. A TAT no longer ahead of now is a full bucket, the same as
--               no key, so the key is deleted.
-- gcra_lease  : as gcra, but only while the TAT is still the mark: nothing was taken after
--               the lease. Another gateway's leased units may sit after them on the timeline,
--               spendable until their own slots begin; moving the TAT back under them would
--               let new requests take those slots a second time.
-- fixed_window, calendar: the count drops by units (never below 0) while the window (period)
--               the units were counted in is still the key's (its end equals the mark); any
--               other window has nothing of them to give back. Both keep it in fields e and n.
-- Charging always lands, past the limit if need be (the units were spent): the key is in debt
-- and refuses requests until time pays it off.
-- gcra        : TAT = max(TAT, now) + units * emission; the key lives until the TAT is past.
-- fixed_window: the units count in the window open now, or in a new one opened now.

local function give_back_gcra(key, now, emission, units, mark, only_last)
  local tat = tonumber(redis.call('GET', key))
  local credit = math.min(emission * units, mark - now)
  if not tat or credit <= 0 or (only_last and tat ~= mark) then
    return 0
  end
  tat = tat - credit
  if tat <= now then
    redis.call('DEL', key)
  else
    redis.call('SET', key, fmt(tat), 'PX', ceil_ms(tat - now))
  end
  return 1
end

local function give_back_count(key, now, units, mark)
  local stored = redis.call('HMGET', key, 'e', 'n')
  local e, n = tonumber(stored[1]), tonumber(stored[2])
  if not e or not n or now >= e or e ~= mark then
    return 0
  end
  redis.call('HSET', key, 'n', fmt(math.max(n - units, 0)))
  return 1
end

local function charge_gcra(key, now, emission, units)
  local tat = math.max(tonumber(redis.call('GET', key)) or now, now) + emission * units
  gcra_commit(key, tat, nil, now)
  return 1
end

local function charge_fixed_window(key, now, window, units)
  local e = tonumber(redis.call('HGET', key, 'e'))
  if e and now < e then
    fixed_window_commit(key, { false, e, nil, nil, units })
  else
    fixed_window_commit(key, { true, now + window, units, window, units })
  end
  return 1
end

if #ARGV ~= 1 + 4 * #KEYS or #KEYS < 1 then
  return redis.error_reply('ERR sluice: settle expects the clock and 4 arguments per key, got ' ..
    #ARGV .. ' arguments for ' .. #KEYS .. ' keys')
end
-- Checked before anything is written: a malformed change leaves every key as it was.
for i = 1, #KEYS do
  local at = 2 + 4 * (i - 1)
  local algorithm = ARGV[at]
  local gives_back_only = algorithm == 'calendar' or algorithm == 'gcra_lease'
  if algorithm ~= 'gcra' and algorithm ~= 'fixed_window' and not gives_back_only then
    return redis.error_reply('ERR sluice: settling does not apply to ' .. tostring(algorithm))
  end
  local param, change, mark = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3])
  if not param or param < 1 or not change or not mark then
    return redis.error_reply('ERR sluice: settling key ' .. i .. ' expects a parameter, a change and a mark')
  end
  if gives_back_only and change > 0 then
    return redis.error_reply('ERR sluice: ' .. algorithm .. ' only gives back')
  end
end

local now = now_us(ARGV[1])
local changed = 0
for i = 1, #KEYS do
  local at = 2 + 4 * (i - 1)
  local algorithm, param = ARGV[at], tonumber(ARGV[at + 1])
  local change, mark = tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3])
  if change < 0 and (algorithm == 'gcra' or algorithm == 'gcra_lease') then
    changed = changed + give_back_gcra(KEYS[i], now, param, -change, mark, algorithm == 'gcra_lease')
  elseif change < 0 then
    changed = changed + give_back_count(KEYS[i], now, -change, mark)
  elseif change > 0 and algorithm == 'gcra' then
    changed = changed + charge_gcra(KEYS[i], now, param, change)
  elseif change > 0 then
    changed = changed + charge_fixed_window(KEYS[i], now, param, change)
  end
end
return changed
