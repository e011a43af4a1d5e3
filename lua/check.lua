-- check.lua: decides a batch of requests, each with every limit of its route, in one atomic call.
--
-- ARGV[1]  : now in microseconds, or "" to read the clock from Redis TIME (the production path:
--            every gateway shares the Redis clock; the explicit clock exists for tests)
-- ARGV[2]  : R, the number of requests in the batch (1 when nothing was waiting)
-- then, for each request r in arrival order:
--            its id, unique across gateways (sliding log members, concurrency leases),
--            n_r, the number of its limits,
--            6 per limit i: algorithm name, param 1, param 2, param 3, cost,
--            shadow (1: decided and reported, but its denial does not deny the request)
-- KEYS     : the state keys of request 1's limits, then request 2's, ... (all keys of a call share
--            one hash tag, so one Cluster slot)
-- Reply    : a flat array, 6 integers per limit, requests in order, limits in KEYS order:
--            allowed (1|0), remaining, retry_after_ms (-1: never), reset_after_ms, delay_ms,
--            mark: where this call left the key, in us (gcra: the TAT written; fixed_window: the
--            window's end), 0 when the call wrote nothing to it or the algorithm has no mark.
--            A refund of units this call took quotes the mark (settle.lua).
--
-- DECIDE and COMMIT map each algorithm this script holds to its functions: src/limiter/script.rs
-- composes one script per set of algorithms (the prelude, those algorithms' files, the two
-- tables, this driver), so a call pays only for the algorithms its requests use.
--
-- The driver is written for Redis's per-call cost: one pass checks the layout before anything
-- is read or written; one pass decides. Per request it creates no closure and no table (the
-- reply and one table of writes serve every request of the call), and an algorithm's write is a
-- plain value where it can be (gcra: the new TAT). Numbers are read from ARGV by arithmetic
-- coercion (`ARGV[i] + 0`), not tonumber: Lua 5.1's tonumber parses a string twice (strtod in
-- lua_isnumber, again in lua_tonumber), coercion once; the layout pass has checked the counts,
-- and a parameter that is not a number is an error either way. A count of "1" (one request,
-- one limit: the common call) is recognised as the interned string it is, without parsing.
--
-- Each request is decided as if it were alone, in arrival order, so a batch admits exactly what
-- the same requests sent one by one would. For one request, phase one reads every state and
-- decides; phase two writes, and only if every limit allowed, so a denied request never consumes
-- quota from the other limits. A shadow limit that denies does not stop the others from being
-- written (and writes nothing itself). When the request is denied, the limits that allowed it
-- report their unconsumed state (a cost-0 peek).

-- The layout, checked before anything is read or written: every request's count of limits and
-- algorithms, and the totals of ARGV and KEYS.
local requests = ARGV[2] == '1' and 1 or tonumber(ARGV[2])
if not requests or requests < 1 then
  return redis.error_reply('ERR sluice: expected the number of requests, got ' .. tostring(ARGV[2]))
end
local arg, key, argc = 3, 0, #ARGV
for r = 1, requests do
  local limits = ARGV[arg + 1]
  limits = limits == '1' and 1 or tonumber(limits)
  if not limits or limits < 1 or arg + 1 + 6 * limits > argc then
    return redis.error_reply('ERR sluice: request ' .. r .. ' of ' .. requests .. ' is malformed')
  end
  for at = arg + 2, arg + 6 * limits - 4, 6 do
    if not DECIDE[ARGV[at]] then
      return redis.error_reply('ERR sluice: unknown algorithm ' .. tostring(ARGV[at]))
    end
  end
  arg, key = arg + 2 + 6 * limits, key + limits
end
if arg - 1 ~= argc or key ~= #KEYS then
  return redis.error_reply('ERR sluice: ' .. argc .. ' arguments and ' .. #KEYS ..
    ' keys do not match ' .. requests .. ' requests')
end

local now = now_us(ARGV[1])
-- The reply is made at its full size, 6 integers per key, in one allocation instead of growing
-- through 1, 2, 4, 8... slots: a table of ARGV's first values (the layout guarantees more than
-- 6 per key), each of which the decision pass overwrites. Bounded, so the values unpacked stay
-- far inside Lua's stack limit; a larger call grows its reply as it goes.
local reply = key <= 64 and { unpack(ARGV, 1, 6 * key) } or {}
local writes = {}
-- arg: the ARGV index of the request's id; key: KEYS before its first key; out: the reply before
-- its first integer. `at` walks its limits' 6 values, `o` their 6 integers.
arg, key = 3, 0
local out = 0
for _ = 1, requests do
  local id, limits = ARGV[arg], ARGV[arg + 1] + 0
  local admitted = true
  local at, o = arg + 2, out
  for i = 1, limits do
    local write
    reply[o + 1], reply[o + 2], reply[o + 3], reply[o + 4], reply[o + 5], write =
      DECIDE[ARGV[at]](KEYS[key + i], now, ARGV[at + 1] + 0, ARGV[at + 2] + 0,
        ARGV[at + 3] + 0, ARGV[at + 4] + 0, id)
    reply[o + 6] = 0
    writes[i] = write or false
    if reply[o + 1] == 0 and ARGV[at + 5] ~= '1' then
      admitted = false
    end
    at, o = at + 6, o + 6
  end
  at, o = arg + 2, out
  if admitted then
    for i = 1, limits do
      if writes[i] then
        reply[o + 6] = COMMIT[ARGV[at]](KEYS[key + i], writes[i], id, now) or 0
      end
      at, o = at + 6, o + 6
    end
  else
    -- Denied: the limits that allowed it report their unconsumed state (a cost-0 peek).
    for i = 1, limits do
      if reply[o + 1] == 1 then
        local _, remaining, retry, reset = DECIDE[ARGV[at]](KEYS[key + i], now,
          ARGV[at + 1] + 0, ARGV[at + 2] + 0, ARGV[at + 3] + 0, 0, id)
        reply[o + 2], reply[o + 3], reply[o + 4], reply[o + 5] = remaining, retry, reset, 0
      end
      at, o = at + 6, o + 6
    end
  end
  arg, key, out = at, key + limits, o
end
return reply
