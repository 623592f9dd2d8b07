-- The next producer id (InitProducerId): the later of the counter's next
-- value and Redis's clock in milliseconds. A counter alone would hand an
-- id out twice after Redis lost its last steps (a failover to a replica
-- that had not seen them, a crash under `appendfsync everysec`) while the
-- producers given them still write: the second producer's batches could
-- pass for the first's duplicates and be dropped. The clock has moved past
-- the lost ids by the time Redis serves again, unless they ran ahead of it
-- (more than a thousand producers initialised per second just before).
-- Milliseconds (13 digits) keep ids exact through Lua's `%.14g` printing.
--
-- KEYS[1] ketch:producer-ids   (an integer as a string; older releases
--         INCR it, which goes on from the value written here)
-- Reply: the id (integer).
local now = redis.call('TIME')
local clock = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local id = math.max(tonumber(redis.call('GET', KEYS[1]) or '0') + 1, clock)
redis.call('SET', KEYS[1], string.format('%d', id))
return id
