-- gcra.lua: generic cell rate algorithm with redis-cell CL.THROTTLE semantics; also the token
-- bucket and the leaky bucket (as a meter), which are GCRA with tolerance = emission * capacity.
--
-- State  : one string key holding the theoretical arrival time (TAT), integer microseconds.
-- Params : p1 = emission interval (period / count) in us,
--          p2 = tolerance in us: emission * (burst + 1), or emission * capacity,
--          p3 = max delay in us (shaping): a request that would pass within p3 more is admitted
--               and held for that long instead of denied (0: never delay).
-- decide(key, now, p1, p2, p3, cost, id) -> allowed (1|0), remaining, retry_after_ms (-1: never),
--                                           reset_after_ms, delay_ms, write: the new TAT (false:
--                                           nothing to store; a number, not a table, so a decision
--                                           allocates nothing)
-- commit(key, write, id, now)            -> SET key <tat> PX <ttl_ms>; the TTL is the time until
--                                           the TAT is in the past, when the state equals no key.
--                                           Returns the mark: the TAT written (us), which a refund
--                                           of these units must quote (settle.lua).
-- A denied request writes nothing. cost = 0 peeks: never denied, writes nothing.

local function gcra_remaining(tolerance, ttl, emission)
  local next = tolerance - ttl
  if next < 0 then
    return 0
  end
  return math.floor(next / emission)
end

local function gcra_decide(key, now, emission, tolerance, max_delay, cost)
  local tat = tonumber(redis.call('GET', key)) or now
  local increment = emission * cost
  local new_tat = math.max(tat, now) + increment
  -- How far beyond the tolerance this request would reach: > 0 means past the burst.
  local over = new_tat - now - tolerance
  -- A peek (cost 0) asks for nothing: it never denies.
  if cost > 0 and over > max_delay then
    local ttl = math.max(tat - now, 0)
    local retry = -1
    if increment <= tolerance + max_delay then
      retry = ceil_ms(over - max_delay)
    end
    return 0, gcra_remaining(tolerance, ttl, emission), retry, ceil_ms(ttl), 0, false
  end
  local remaining, reset = gcra_remaining(tolerance, new_tat - now, emission), ceil_ms(new_tat - now)
  if cost > 0 then
    return 1, remaining, 0, reset, ceil_ms(over), new_tat
  end
  return 1, remaining, 0, reset, 0, false
end

local function gcra_commit(key, tat, _, now)
  redis.call('SET', key, fmt(tat), 'PX', ceil_ms(tat - now))
  return tat
end
