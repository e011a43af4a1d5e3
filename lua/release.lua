-- release.lua: returns concurrency leases (a separate script from check.lua).
--
-- KEYS[i] : the state keys of a request's concurrency limits (one hash tag)
-- ARGV[1] : the request id that holds the leases
-- Reply   : the number of leases removed
local removed = 0
for i = 1, #KEYS do
  removed = removed + redis.call('ZREM', KEYS[i], ARGV[1])
end
return removed
