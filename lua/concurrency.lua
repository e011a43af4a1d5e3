-- concurrency.lua: at most N requests in flight per key, each holding an expiring lease.
--
-- State  : one sorted set: member = request id, score = lease expiry in us. A lease ends when
--          the gateway releases it (release.lua: response finished, or client gone) or when it
--          expires, so a gateway that dies cannot leak slots.
-- Params : p1 = max in flight, p2 = lease length in us, p3 unused. cost: 0 peeks, else 1 lease.
-- decide(key, now, p1, p2, p3, cost, id) -> allowed (1|0), remaining, retry_after_ms,
--                                           reset_after_ms, delay_ms (always 0), write
--          retry_after: until the earliest lease expires, at most 1 s (slots usually free sooner).
-- commit(key, write, id)                 -> ZREMRANGEBYSCORE (expired leases), ZADD the lease,
--                                           PEXPIRE until the last lease expires
-- A denied request writes nothing.

local CONCURRENCY_MAX_RETRY_US = 1000000

local function concurrency_decide(key, now, max, lease, _, cost)
  local after = '(' .. fmt(now)
  local count = redis.call('ZCOUNT', key, after, '+inf')
  local latest = 0
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] then
    latest = math.max(tonumber(last[2]) - now, 0)
  end
  if cost == 0 then
    return 1, math.max(max - count, 0), 0, ceil_ms(latest), 0, nil
  end
  if count + 1 > max then
    local first = redis.call('ZRANGEBYSCORE', key, after, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    local earliest = tonumber(first[2]) - now
    return 0, 0, ceil_ms(math.min(math.max(earliest, 1), CONCURRENCY_MAX_RETRY_US)), ceil_ms(latest), 0, nil
  end
  local ttl = math.max(latest, lease)
  return 1, max - count - 1, 0, ceil_ms(ttl), 0, { now, lease, ttl }
end

local function concurrency_commit(key, write, id)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(write[1]))
  redis.call('ZADD', key, fmt(write[1] + write[2]), id)
  redis.call('PEXPIRE', key, ceil_ms(write[3]))
end
