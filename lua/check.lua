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
--            A refund of units this call took quotes the mark (refund.lua).
--
-- Each request is decided as if it were alone, in arrival order, so a batch admits exactly what
-- the same requests sent one by one would. For one request, phase one reads every state and
-- decides; phase two writes, and only if every limit allowed, so a denied request never consumes
-- quota from the other limits. A shadow limit that denies does not stop the others from being
-- written (and writes nothing itself). When the request is denied, the limits that allowed it
-- report their unconsumed state (a cost-0 peek).

local ALGORITHMS = {
  gcra = { gcra_decide, gcra_commit },
  fixed_window = { fixed_window_decide, fixed_window_commit },
  calendar = { calendar_decide, calendar_commit },
  sliding_window = { sliding_window_decide, sliding_window_commit },
  sliding_log = { sliding_log_decide, sliding_log_commit },
  concurrency = { concurrency_decide, concurrency_commit },
}

-- The requests' layout, checked before anything is read or written: for each request, the ARGV
-- index of its id, the KEYS index before its first key, and its number of limits.
local requests = tonumber(ARGV[2])
if not requests or requests < 1 then
  return redis.error_reply('ERR sluice: expected the number of requests, got ' .. tostring(ARGV[2]))
end
local layout, arg, key = {}, 3, 0
for r = 1, requests do
  local limits = tonumber(ARGV[arg + 1])
  if not limits or limits < 1 or arg + 1 + 6 * limits > #ARGV then
    return redis.error_reply('ERR sluice: request ' .. r .. ' of ' .. requests .. ' is malformed')
  end
  for i = 0, limits - 1 do
    local name = ARGV[arg + 2 + 6 * i]
    if not ALGORITHMS[name] then
      return redis.error_reply('ERR sluice: unknown algorithm ' .. tostring(name))
    end
  end
  layout[r] = { arg, key, limits }
  arg, key = arg + 2 + 6 * limits, key + limits
end
if arg - 1 ~= #ARGV or key ~= #KEYS then
  return redis.error_reply('ERR sluice: ' .. #ARGV .. ' arguments and ' .. #KEYS ..
    ' keys do not match ' .. requests .. ' requests')
end

local now = now_us(ARGV[1])
local reply = {}

-- Decides one request: its id at ARGV[arg], its limits' keys after KEYS[key], `limits` of them;
-- its 6 integers per limit go into the reply after index `out`.
local function decide_request(arg, key, limits, out)
  local id = ARGV[arg]
  local function decide(i, cost)
    local at = arg + 2 + 6 * (i - 1)
    return ALGORITHMS[ARGV[at]][1](KEYS[key + i], now, tonumber(ARGV[at + 1]),
      tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3]), cost, id)
  end

  local writes, all_allowed = {}, true
  for i = 1, limits do
    local at = arg + 2 + 6 * (i - 1)
    local allowed, remaining, retry, reset, delay, write = decide(i, tonumber(ARGV[at + 4]))
    if allowed == 0 and ARGV[at + 5] ~= '1' then
      all_allowed = false
    end
    writes[i] = write
    local o = out + 6 * (i - 1)
    reply[o + 1], reply[o + 2], reply[o + 3], reply[o + 4], reply[o + 5] = allowed, remaining, retry, reset, delay
    reply[o + 6] = 0
  end

  if all_allowed then
    for i = 1, limits do
      if writes[i] then
        local commit = ALGORITHMS[ARGV[arg + 2 + 6 * (i - 1)]][2]
        reply[out + 6 * (i - 1) + 6] = commit(KEYS[key + i], writes[i], id) or 0
      end
    end
  else
    for i = 1, limits do
      local o = out + 6 * (i - 1)
      if reply[o + 1] == 1 then
        local _, remaining, retry, reset = decide(i, 0)
        reply[o + 2], reply[o + 3], reply[o + 4], reply[o + 5] = remaining, retry, reset, 0
      end
    end
  end
end

for r = 1, requests do
  local at = layout[r]
  decide_request(at[1], at[2], at[3], 6 * at[2])
end
return reply
