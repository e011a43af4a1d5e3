-- admin/announce.lua: one more change counted in the admin epoch, after a reset or a credit
-- (which change counts, not the overrides: every gateway forgets the denials it cached).
-- Composed after prelude.lua (fmt, now_us) and admin/epoch.lua.
--
-- KEYS[1] : the admin epoch key
-- ARGV[1] : now in microseconds, or "" to read Redis TIME (production)
-- Reply   : the epoch, which only grows (see admin/epoch.lua)
return announce(KEYS[1], now_us(ARGV[1]))
