-- sliding_log.lua: exact sliding window, a log of admitted units.
--
-- State  : one sorted set: one member per admitted unit, "<request id>:<n>" (unique across
--          gateways), scored by its time in us. Memory grows with the limit: the config caps it.
-- Params : p1 = limit, p2 = window length in us, p3 unused.
-- A unit admitted at t counts until t + W. A request passes iff the units of the last window
-- plus its cost fit the limit.
-- decide(key, now, p1, p2, p3, cost, id) -> allowed (1|0), remaining, retry_after_ms (-1: never),
--                                           reset_after_ms, delay_ms (always 0), write
-- commit(key, write, id)                 -> ZREMRANGEBYSCORE (units out of the window), ZADD the
--                                           new units, PEXPIRE W (the newest unit's lifetime)
-- A denied request writes nothing (expired units are only trimmed by a commit). The clock never
-- runs backwards inside a key: a time before the newest unit counts as that unit's time.

local function sliding_log_decide(key, now, limit, window, _, cost)
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  local newest_at = tonumber(newest[2])
  if newest_at then
    now = math.max(now, newest_at)
  end
  local after = '(' .. fmt(now - window)
  local count = redis.call('ZCOUNT', key, after, '+inf')
  local reset = 0
  if newest_at and newest_at > now - window then
    reset = newest_at + window - now
  end
  -- A peek (cost 0) asks for nothing: it never denies.
  if cost > 0 and count + cost > limit then
    local retry = -1
    if cost <= limit then
      -- The (count + cost - limit)-th oldest live unit must leave the window first.
      local unit = redis.call('ZRANGEBYSCORE', key, after, '+inf', 'WITHSCORES', 'LIMIT', count + cost - limit - 1, 1)
      retry = ceil_ms(tonumber(unit[2]) + window - now)
    end
    return 0, math.max(limit - count, 0), retry, ceil_ms(reset), 0, nil
  end
  if cost == 0 then
    return 1, math.max(limit - count, 0), 0, ceil_ms(reset), 0, nil
  end
  return 1, limit - count - cost, 0, ceil_ms(window), 0, { now, window, cost }
end

local function sliding_log_commit(key, write, id)
  local now, window, cost = write[1], write[2], write[3]
  redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now - window))
  local score = fmt(now)
  local args = {}
  for n = 1, cost do
    args[#args + 1] = score
    args[#args + 1] = id .. ':' .. n
    if #args >= 512 or n == cost then
      redis.call('ZADD', key, unpack(args))
      args = {}
    end
  end
  redis.call('PEXPIRE', key, ceil_ms(window))
end
