-- global.lua: one limit across regions (scope: global, src/limiter/regions/): a calendar
-- period's counter (calendar.lua) in this region's Redis, whose room is this region's part of the
-- whole, moved by what region sync writes beside the count.
--
-- State  : one hash key, fields s, e, n as calendar.lua's, and, written by region sync only:
--          i:<region> = units that region has given this one in this period, in total;
--          o:<region> = units this region has given that one, in total;
--          r:<region> = that region's latest known count (consistency: approx).
--          Every field is a total that only grows within a period (lua/regions/apply.lua), so
--          an update lost, repeated or reordered never counts twice.
-- Params : p1 = base (strict: this region's allotment; approx: the whole limit), p2 = start and
--          p3 = end (us) of the period holding the gateway's clock, as calendar.lua's.
-- decide(key, now, p1, p2, p3, cost, id) -> as calendar.lua's, against
--          room = base + sum(i:) - sum(o:) - sum(r:), never below 0.
-- commit(key, write, id)                 -> HSET s e n + PEXPIRE; a new period first deletes the
--          old one's fields (its transfers belong to it). Returns the period's end.
-- A denied request writes nothing. cost = 0 peeks.

-- Where `key` stands in the period holding `now` (calendar.lua's choice of period): its bounds,
-- its count, what region sync moved (sum(i:) - sum(o:) - sum(r:)), whether the stored counter is
-- this period's, and the microseconds until it resets and until the key may lapse.
local function global_state(key, now, start, finish)
  local from, to = start, finish
  if now < start then
    from, to = 0, start
  elseif now >= finish then
    from, to = finish, 0
  end
  local flat = redis.call('HGETALL', key)
  local s, e, n, moved = nil, nil, nil, 0
  for i = 1, #flat, 2 do
    local field = flat[i]
    if field == 's' then
      s = tonumber(flat[i + 1])
    elseif field == 'e' then
      e = tonumber(flat[i + 1])
    elseif field == 'n' then
      n = tonumber(flat[i + 1])
    elseif string.byte(field, 1) == 105 then -- 'i': given to this region
      moved = moved + tonumber(flat[i + 1])
    else -- 'o': given away; 'r': counted by another region
      moved = moved - tonumber(flat[i + 1])
    end
  end
  local count, same = 0, false
  if n and s ~= 0 and to ~= 0 and s >= to then
    from, to = s, e
  end
  if n and ((from ~= 0 and s == from) or (to ~= 0 and e == to)) then
    count, same = n, true
    if from == 0 then
      from = s
    end
    if to == 0 then
      to = e
    end
  end
  if not same then
    moved = 0
  end
  local length = finish - start
  if to ~= 0 then
    return from, to, count, moved, same, to - now, to - now
  end
  return from, to, count, moved, same, finish + length - now, finish + 2 * length - now
end

local function global_decide(key, now, base, start, finish, cost)
  local from, to, count, moved, same, reset, ttl = global_state(key, now, start, finish)
  local room = math.max(base + moved, 0)
  local allowed, remaining, retry, reset_ms, delay = count_against(room, count, cost, reset)
  local write = nil
  if allowed == 1 and cost > 0 then
    write = { from, to, count + cost, ttl, same }
  end
  return allowed, remaining, retry, reset_ms, delay, write
end

local function global_commit(key, write)
  if not write[5] then
    redis.call('DEL', key)
  end
  redis.call('HSET', key, 's', fmt(write[1]), 'e', fmt(write[2]), 'n', fmt(write[3]))
  redis.call('PEXPIRE', key, ceil_ms(write[4]))
  return write[2]
end
