-- regions/apply.lua: region sync applies a total another region published (units it gave this
-- one, i:<giver>; or its count, r:<region>) to a global limit's key in this region's Redis
-- (composed after prelude.lua and global.lua). A total only grows within a period, so the
-- larger one is kept: a total lost, repeated or reordered is applied once. A total of an
-- earlier period than the key's is dropped; one of a later period opens that period.
--
-- KEYS[1] : the limit's key
-- ARGV    : now (us, or "" for Redis TIME), period start, period end (us), field, total
-- Reply   : 1 when the total was applied, 0 when it was not larger or not this period's

local key = KEYS[1]
local now = now_us(ARGV[1])
local start, finish = ARGV[2] + 0, ARGV[3] + 0
local field, total = ARGV[4], ARGV[5] + 0
if finish <= now then
  return 0
end
local stored = redis.call('HMGET', key, 's', 'e', field)
local s, e = tonumber(stored[1]), tonumber(stored[2])
if s and s ~= start and e ~= finish then
  if s >= finish then
    return 0
  end
  redis.call('DEL', key)
  s = nil
end
if not s then
  redis.call('HSET', key, 's', fmt(start), 'e', fmt(finish), 'n', '0')
  redis.call('PEXPIRE', key, ceil_ms(finish - now))
elseif total <= (tonumber(stored[3]) or 0) then
  return 0
end
redis.call('HSET', key, field, fmt(total))
return 1
