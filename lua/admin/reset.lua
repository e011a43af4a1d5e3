-- admin/reset.lua: the quota admin API's reset (src/edge/quota_admin/), atomic in Redis. A
-- script of its own (no prelude: it reads no clock). Mirrors the in-process backend's reset
-- (src/limiter/local.rs).
--
-- KEYS  : limits' state keys (one hash tag)
-- ARGV  : none
-- Reply : how many of them existed. Deletes them: a deleted key is a full quota, for every
--         algorithm.
local existed = 0
for i = 1, #KEYS do
  existed = existed + redis.call('DEL', KEYS[i])
end
return existed
