-- calendar.lua: a counter per period whose bounds the gateway gives: calendar periods in a time
-- zone (day, week, month, year: Redis has no time zone database) or windows aligned to the epoch
-- (the Envoy rate limit service).
--
-- State  : one hash key, fields s = period start (us), e = period end (us), n = units counted.
--          A bound not known yet is 0.
-- Params : p1 = limit (units per period), p2 = start and p3 = end (us) of the period holding the
--          gateway's clock. The period holding `now` (Redis TIME) is the given one, the one that
--          ends at p2 (the gateway is ahead of Redis), or the one that starts at p3 (it is
--          behind): so the gateway's clock may be off by up to one period's length. The stored
--          counter belongs to that period when its start or its end matches a known bound.
--          An end not known yet (the gateway is behind) is reported as p3 + (p3 - p2), and the
--          key is kept one such length longer.
-- decide(key, now, p1, p2, p3, cost, id) -> allowed (1|0), remaining, retry_after_ms (-1: never),
--                                           reset_after_ms, delay_ms (always 0), write
-- commit(key, write, id)                 -> HSET s e n + PEXPIRE <ms to the period's end>.
--                                           Returns the mark: the period's end (us; 0 while
--                                           it is not known), which giving back a lease's
--                                           unspent units quotes (settle.lua).
-- A denied request writes nothing. A counter of a later period than the one holding now (the
-- clock went back across a boundary) is kept and counted in. A count above the limit (written under a higher limit)
-- denies until the period ends. cost = 0 peeks: never denied, writes nothing.

local function calendar_decide(key, now, limit, start, finish, cost)
  local from, to = start, finish
  if now < start then
    from, to = 0, start
  elseif now >= finish then
    from, to = finish, 0
  end
  local stored = redis.call('HMGET', key, 's', 'e', 'n')
  local s, e, n = tonumber(stored[1]), tonumber(stored[2]), tonumber(stored[3])
  local count = 0
  -- The clock never runs backwards inside a key: a counter of a later period than the one
  -- holding now is the period the request counts in.
  if n and s ~= 0 and to ~= 0 and s >= to then
    from, to = s, e
  end
  if n and ((from ~= 0 and s == from) or (to ~= 0 and e == to)) then
    count = n
    if from == 0 then
      from = s
    end
    if to == 0 then
      to = e
    end
  end
  local length = finish - start
  local reset, ttl
  if to ~= 0 then
    reset, ttl = to - now, to - now
  else
    reset, ttl = finish + length - now, finish + 2 * length - now
  end
  local allowed, remaining, retry, reset_ms, delay = count_against(limit, count, cost, reset)
  local write = nil
  if allowed == 1 and cost > 0 then
    write = { from, to, count + cost, ttl }
  end
  return allowed, remaining, retry, reset_ms, delay, write
end

local function calendar_commit(key, write)
  redis.call('HSET', key, 's', fmt(write[1]), 'e', fmt(write[2]), 'n', fmt(write[3]))
  redis.call('PEXPIRE', key, ceil_ms(write[4]))
  return write[2]
end
