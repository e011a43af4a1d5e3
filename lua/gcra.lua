-- gcra.lua: generic cell rate algorithm with redis-cell CL.THROTTLE semantics.
--
-- State  : one string key holding the theoretical arrival time (TAT), integer microseconds.
-- Params : p1 = emission interval (period / count) in us,
--          p2 = tolerance = emission * (burst + 1) in us, so burst + 1 requests pass at once.
-- decide(key, now, p1, p2, cost) -> allowed (1|0), remaining, retry_after_ms (-1: never),
--                                   reset_after_ms, write (nil: nothing to store)
-- commit(key, write)             -> SET key <tat> PX <ttl_ms>; the TTL is the time until the
--                                   TAT is in the past, when the state equals an absent key.
-- A denied request writes nothing. cost = 0 peeks and writes nothing.

local function gcra_remaining(tolerance, ttl, emission)
  local next = tolerance - ttl
  if next < 0 then
    return 0
  end
  return math.floor(next / emission)
end

local function gcra_decide(key, now, emission, tolerance, cost)
  local tat = tonumber(redis.call('GET', key)) or now
  local increment = emission * cost
  local new_tat = math.max(tat, now) + increment
  local diff = now - (new_tat - tolerance)
  if diff < 0 then
    local ttl = math.max(tat - now, 0)
    local retry = -1
    if increment <= tolerance then
      retry = ceil_ms(-diff)
    end
    return 0, gcra_remaining(tolerance, ttl, emission), retry, ceil_ms(ttl), nil
  end
  local ttl = new_tat - now
  local write = nil
  if cost > 0 then
    write = { new_tat, ttl }
  end
  return 1, gcra_remaining(tolerance, ttl, emission), 0, ceil_ms(ttl), write
end

local function gcra_commit(key, write)
  redis.call('SET', key, fmt(write[1]), 'PX', ceil_ms(write[2]))
end
