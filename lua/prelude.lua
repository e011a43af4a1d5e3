-- prelude.lua: helpers shared by every algorithm file. sluice concatenates, in this order,
-- prelude.lua, one file per algorithm, and check.lua into ONE script (see src/limiter/script.rs).
--
-- Lua numbers are doubles: integers below 2^53 are exact, and every time here is an integer
-- count of microseconds (about 2^51 today), so arithmetic is exact. Two traps are avoided:
--   * tostring() of a large number gives "%.14g" (e.g. 1.7635012345679e+15): values written to
--     Redis go through fmt(), which prints every digit;
--   * numbers returned to Redis are truncated to integers: replies are integer milliseconds.

-- An integer as a decimal string, all digits.
local function fmt(n)
  return string.format('%d', n)
end

-- The time of this call in microseconds: `given` (an explicit clock, for tests) or Redis TIME,
-- the production path, so every gateway shares the Redis clock.
local function now_us(given)
  local now = given ~= '' and tonumber(given)
  if now then
    return now
  end
  if redis.replicate_commands then
    redis.replicate_commands() -- Redis < 7: replicate effects so TIME may precede writes
  end
  local t = redis.call('TIME')
  return t[1] * 1000000 + t[2] -- coerced, each parsed once (see tonumber in check.lua)
end

-- Microseconds to whole milliseconds, rounded up (0 for anything not positive).
local function ceil_ms(us)
  if us <= 0 then
    return 0
  end
  return math.ceil(us / 1000)
end

-- A count of units held against `limit` in a period that is full again in `reset` us (fixed
-- windows, calendar periods), asked for `cost` more: allowed (1|0), remaining, retry_after_ms
-- (-1: never, the cost alone exceeds the limit), reset_after_ms and delay_ms (0) of the
-- decision; the caller writes `count + cost` when allowed. A peek (cost 0) asks for nothing: it
-- never denies. Mirrors count_against in src/limiter/algorithm/mod.rs.
local function count_against(limit, count, cost, reset)
  if cost > 0 and count + cost > limit then
    local retry = -1
    if cost <= limit then
      retry = ceil_ms(reset)
    end
    return 0, math.max(limit - count, 0), retry, ceil_ms(reset), 0
  end
  return 1, math.max(limit - count - cost, 0), 0, ceil_ms(reset), 0
end
