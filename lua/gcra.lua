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

-- Written for Redis's per-call cost: each decision is one function call with its arithmetic
-- inline (no helper calls: a Lua call costs more than the arithmetic it wraps, and a batch of
-- requests pays it per limit). ceil_ms and the floor of remaining units are spelled out here.

local function gcra_decide(key, now, emission, tolerance, max_delay, cost)
  local tat = tonumber(redis.call('GET', key)) or now
  if tat < now then
    tat = now -- a TAT in the past is a full bucket: the state is as if absent
  end
  local increment = emission * cost
  local new_tat = tat + increment
  -- How far beyond the tolerance this request would reach: > 0 means past the burst.
  local over = new_tat - now - tolerance
  -- A peek (cost 0) asks for nothing: it never denies.
  if cost > 0 and over > max_delay then
    local ttl = tat - now
    local retry = -1
    if increment <= tolerance + max_delay then
      retry = math.ceil((over - max_delay) / 1000)
    end
    local left = tolerance - ttl
    return 0, left < 0 and 0 or math.floor(left / emission), retry,
      ttl > 0 and math.ceil(ttl / 1000) or 0, 0, false
  end
  local ttl = new_tat - now
  local left = tolerance - ttl
  local remaining = left < 0 and 0 or math.floor(left / emission)
  local reset = ttl > 0 and math.ceil(ttl / 1000) or 0
  if cost > 0 then
    return 1, remaining, 0, reset, over > 0 and math.ceil(over / 1000) or 0, new_tat
  end
  return 1, remaining, 0, reset, 0, false
end

-- The TTL is at least 1 ms: the TAT is in the future (a write always adds cost > 0 emissions).
local function gcra_commit(key, tat, _, now)
  redis.call('SET', key, string.format('%d', tat), 'PX', math.ceil((tat - now) / 1000))
  return tat
end
