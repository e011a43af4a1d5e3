-- regions/lease.lua: who runs region sync in this region: the holder of one key, taken when it
-- is free, kept by its holder, given up by it.
--
-- KEYS[1] : the lease
-- ARGV    : the instance asking, and the lease's life in ms (0: give it up)
-- Reply   : 1 when the asker holds it now, 0 when another does (or it was given up)

local held = redis.call('GET', KEYS[1])
local life = ARGV[2] + 0
if life == 0 then
  if held == ARGV[1] then
    redis.call('DEL', KEYS[1])
  end
  return 0
end
if not held then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', life)
  return 1
end
if held == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], life)
  return 1
end
return 0
