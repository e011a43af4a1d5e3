-- sliding_window.lua: two-counter approximation of a sliding window.
--
-- State  : one hash key: s = start of the current window (aligned to a multiple of the window
--          length), c = units counted in it, p = units counted in the window before.
-- Params : p1 = limit, p2 = window length in us, p3 unused.
-- Estimate of the units in the last window: c + ceil(p * (W - elapsed) / W), the previous
-- window weighted by the part of it still inside the sliding window, rounded UP (never
-- undercounts). A request passes iff estimate + cost <= limit. The same double operations in the
-- same order run in src/limiter/algorithm/sliding_window.rs, so both give identical answers.
-- decide(key, now, p1, p2, p3, cost, id) -> allowed (1|0), remaining, retry_after_ms (-1: never),
--                                           reset_after_ms, delay_ms (always 0), write
-- commit(key, write, id)                 -> HSET s p c + PEXPIRE <ms until both windows are past>
-- A denied request writes nothing. A time before the stored window's start counts as its start.

local function sliding_window_weighted(previous, window, elapsed)
  if previous == 0 then
    return 0
  end
  return math.ceil(previous * (window - elapsed) / window)
end

-- The elapsed time in a window at which ceil(count * (W - e) / W) <= room.
local function sliding_window_fits(room, window, count)
  if count == 0 then
    return 0
  end
  return window - math.floor(room * window / count)
end

local function sliding_window_decide(key, now, limit, window, _, cost)
  local stored = redis.call('HMGET', key, 's', 'p', 'c')
  local s = tonumber(stored[1])
  local start, previous, current
  if s then
    now = math.max(now, s)
    start = now - now % window
    if start == s then
      previous, current = tonumber(stored[2]) or 0, tonumber(stored[3]) or 0
    elseif start == s + window then
      previous, current = tonumber(stored[3]) or 0, 0
    else
      previous, current = 0, 0
    end
  else
    start, previous, current = now - now % window, 0, 0
  end
  local elapsed = now - start
  local estimate = sliding_window_weighted(previous, window, elapsed) + current
  local function reset(count)
    if count > 0 then
      return start + 2 * window - now
    elseif previous > 0 then
      return start + window - now
    end
    return 0
  end
  -- A peek (cost 0) asks for nothing: it never denies.
  if cost > 0 and estimate + cost > limit then
    local retry = -1
    if cost <= limit then
      local wait
      if current + cost <= limit then
        wait = sliding_window_fits(limit - current - cost, window, previous) - elapsed
      else
        -- Only in the next window, where this window's count becomes the previous one.
        wait = (start + window - now) + sliding_window_fits(limit - cost, window, current)
      end
      retry = ceil_ms(math.max(wait, 1))
    end
    return 0, math.max(limit - estimate, 0), retry, ceil_ms(reset(current)), 0, nil
  end
  local write = nil
  if cost > 0 then
    write = { start, previous, current + cost, start + 2 * window - now }
  end
  return 1, math.max(limit - estimate - cost, 0), 0, ceil_ms(reset(current + cost)), 0, write
end

local function sliding_window_commit(key, write)
  redis.call('HSET', key, 's', fmt(write[1]), 'p', fmt(write[2]), 'c', fmt(write[3]))
  redis.call('PEXPIRE', key, ceil_ms(write[4]))
end
