-- fixed_window.lua: a counter per window; the window opens at the first hit (INCRBY + PEXPIRE).
--
-- State  : one hash key, fields e = window end (us) and n = units counted in the window.
--          The end is stored beside the count so the decision follows the script's clock
--          (Redis TIME, or the explicit test clock), not only the key's expiry.
-- Params : p1 = limit (units per window), p2 = window length in us, p3 unused.
-- decide(key, now, p1, p2, p3, cost, id) -> allowed (1|0), remaining, retry_after_ms (-1: never),
--                                           reset_after_ms, delay_ms (always 0), write
-- commit(key, write, id)                 -> new window: HSET e n + PEXPIRE <ms to window end>;
--                                           same window: HINCRBY n cost (the TTL already ends it).
--                                           Returns the mark: the window's end (us), which a
--                                           refund of these units must quote (settle.lua).
-- A denied request writes nothing. The clock never runs backwards inside a key: a time before
-- the stored window's start counts as its start.

local function fixed_window_decide(key, now, limit, window, _, cost)
  local stored = redis.call('HMGET', key, 'e', 'n')
  local e, n = tonumber(stored[1]), tonumber(stored[2]) or 0
  local fresh = true
  if e then
    now = math.max(now, e - window)
    if now < e then
      fresh = false
    end
  end
  if fresh then
    e, n = now + window, 0
  end
  local reset = e - now
  local allowed, remaining, retry, reset_ms, delay = count_against(limit, n, cost, reset)
  local write = nil
  if allowed == 1 and cost > 0 then
    write = { fresh, e, n + cost, reset, cost }
  end
  return allowed, remaining, retry, reset_ms, delay, write
end

local function fixed_window_commit(key, write)
  if write[1] then
    redis.call('HSET', key, 'e', fmt(write[2]), 'n', fmt(write[3]))
    redis.call('PEXPIRE', key, ceil_ms(write[4]))
  else
    redis.call('HINCRBY', key, 'n', fmt(write[5]))
  end
  return write[2]
end
