-- regions/give.lua: region sync gives `units` of this region's unspent part of a global limit
-- to region `taker`, in this region's Redis (composed after prelude.lua and global.lua). Never
-- more than is unspent: the count, plus what was moved in, less what was moved out, stays within
-- the base, so the regions' parts and the units in flight never sum past the whole.
--
-- KEYS[1] : the limit's key
-- ARGV    : now (us, or "" for Redis TIME), base, period start, period end (us), the field of
--           the taker (o:<region>), units asked for
-- Reply   : { units given, the field's new total (0 when nothing was given) }

local key = KEYS[1]
local now = now_us(ARGV[1])
local base, start, finish = ARGV[2] + 0, ARGV[3] + 0, ARGV[4] + 0
local field, units = ARGV[5], ARGV[6] + 0
local from, to, count, moved, same, _, ttl = global_state(key, now, start, finish)
local given = math.min(units, base + moved - count)
if given <= 0 or ttl <= 0 then
  return { 0, 0 }
end
if not same then
  redis.call('DEL', key)
  redis.call('HSET', key, 's', fmt(from), 'e', fmt(to), 'n', '0')
  redis.call('PEXPIRE', key, ceil_ms(ttl))
end
return { given, redis.call('HINCRBY', key, field, given) }
