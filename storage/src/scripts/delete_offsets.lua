-- Deletes a group's committed offsets of some partitions (OffsetDelete),
-- and the offsets open transactions staged for them, in one step: a
-- transaction's commit landing meanwhile cannot bring a deleted offset
-- back (Kafka's tombstone removes both at once).
--
-- KEYS[1] ketch:group:{G}:offsets
-- KEYS[2] ketch:group:{G}:txn-offsets (fields `<topic>:<partition>:<producer id>`)
-- ARGV    the partitions' fields, `<topic>:<partition>`
local wanted = {}
for _, field in ipairs(ARGV) do
  redis.call('HDEL', KEYS[1], field)
  wanted[field] = true
end
for _, field in ipairs(redis.call('HKEYS', KEYS[2])) do
  local partition = string.match(field, '^(.*):[^:]*$')
  if partition and wanted[partition] then
    redis.call('HDEL', KEYS[2], field)
  end
end
return 0
