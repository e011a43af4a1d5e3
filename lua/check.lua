-- check.lua: decides every limit of one route in one atomic call.
--
-- KEYS[i]  : state key of limit i (all keys of a call share one hash tag, so one Cluster slot)
-- ARGV[1]  : now in microseconds, or "" to read the clock from Redis TIME (the production path:
--            every gateway shares the Redis clock; the explicit clock exists for tests)
-- ARGV[2]  : request id, unique across gateways (sliding log members, concurrency leases)
-- ARGV[3 + 6*(i-1) ..] for limit i: algorithm name, param 1, param 2, param 3, cost,
--            shadow (1: decided and reported, but its denial does not deny the request)
-- Reply    : a flat array, 6 integers per limit, in KEYS order:
--            allowed (1|0), remaining, retry_after_ms (-1: never), reset_after_ms, delay_ms,
--            mark: where this call left the key, in us (gcra: the TAT written; fixed_window: the
--            window's end), 0 when the call wrote nothing to it or the algorithm has no mark.
--            A refund of units this call took quotes the mark (refund.lua).
--
-- Phase one reads every state and decides; phase two writes, and only if every limit allowed,
-- so a denied request never consumes quota from the other limits. A shadow limit that denies does
-- not stop the others from being written (and writes nothing itself). When the request is denied,
-- the limits that allowed it report their unconsumed state (a cost-0 peek).

if #ARGV ~= 2 + 6 * #KEYS then
  return redis.error_reply('ERR sluice: expected ' .. (2 + 6 * #KEYS) .. ' arguments, got ' .. #ARGV)
end

local now = now_us(ARGV[1])
local id = ARGV[2]

local ALGORITHMS = {
  gcra = { gcra_decide, gcra_commit },
  fixed_window = { fixed_window_decide, fixed_window_commit },
  sliding_window = { sliding_window_decide, sliding_window_commit },
  sliding_log = { sliding_log_decide, sliding_log_commit },
  concurrency = { concurrency_decide, concurrency_commit },
}

local function decide(i, cost)
  local base = 3 + 6 * (i - 1)
  local algorithm = ALGORITHMS[ARGV[base]]
  return algorithm[1](KEYS[i], now, tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2]),
    tonumber(ARGV[base + 3]), cost, id)
end

for i = 1, #KEYS do
  local name = ARGV[3 + 6 * (i - 1)]
  if not ALGORITHMS[name] then
    return redis.error_reply('ERR sluice: unknown algorithm ' .. tostring(name))
  end
end

local reply, writes, all_allowed = {}, {}, true
for i = 1, #KEYS do
  local allowed, remaining, retry, reset, delay, write = decide(i, tonumber(ARGV[7 + 6 * (i - 1)]))
  if allowed == 0 and ARGV[8 + 6 * (i - 1)] ~= '1' then
    all_allowed = false
  end
  writes[i] = write
  local at = 6 * (i - 1)
  reply[at + 1], reply[at + 2], reply[at + 3], reply[at + 4], reply[at + 5] = allowed, remaining, retry, reset, delay
  reply[at + 6] = 0
end

if all_allowed then
  for i = 1, #KEYS do
    if writes[i] then
      reply[6 * (i - 1) + 6] = ALGORITHMS[ARGV[3 + 6 * (i - 1)]][2](KEYS[i], writes[i], id) or 0
    end
  end
else
  for i = 1, #KEYS do
    local at = 6 * (i - 1)
    if reply[at + 1] == 1 then
      local _, remaining, retry, reset = decide(i, 0)
      reply[at + 2], reply[at + 3], reply[at + 4], reply[at + 5] = remaining, retry, reset, 0
    end
  end
end
return reply
