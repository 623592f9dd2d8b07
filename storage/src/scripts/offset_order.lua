-- The order of a group's offset commits, plain and transactional (a
-- prelude of txn_offsets.lua and commit_offsets.lua). Kafka keeps, of a
-- partition's committed offset and a transaction's offset for it, the one
-- whose record came later in its offsets log: a plain commit made after a
-- transaction staged its offset stands when that transaction commits, and
-- of two transactions' offsets the later staged stands.
--
-- Here every stage takes the next number of field 'order' of
-- ketch:group:{G}:txn-offsets, and that number is written at the end of
-- each offset's JSON it stages (`,"order":N}`); a plain commit writes the
-- counter's current value (the last stage's) into each offset it commits,
-- when there is a counter. An offset a transaction commits is applied only
-- if its number is above that of the offset committed now. Offsets without
-- a number (committed before any stage, or by an older release) count as 0.

-- The order number of an offset's JSON (0 for none).
local function offset_order(json)
  if not json then
    return 0
  end
  return tonumber(string.match(json, ',"order":(%d+)}$')) or 0
end

-- The offset's JSON with order number `order` (a string) at its end.
local function with_order(json, order)
  if string.sub(json, -1) ~= '}' then
    error('an offset that is not a JSON object: ' .. json)
  end
  return string.sub(json, 1, -2) .. ',"order":' .. order .. '}'
end

-- The last stage's number, from field 'order' of the staged offsets' hash
-- `staged_key`; when the field is gone (an older release's sweep of
-- stale staged offsets removes fields it cannot read), the largest number
-- an offset still staged there carries, so that nothing written now is
-- ordered before a stage made earlier.
local function current_order(staged_key)
  local order = redis.call('HGET', staged_key, 'order')
  if order then
    return tonumber(order)
  end
  local largest = 0
  for _, value in ipairs(redis.call('HVALS', staged_key)) do
    largest = math.max(largest, offset_order(value))
  end
  return largest
end
