-- An idempotent producer's state in a partition (ketch:{TAG}:producers,
-- producer id -> state), as the scripts that read it see it: a table
--   {e = epoch, t = last activity (Redis time, ms),
--    b = the last five batches, flat: {first_seq, last_seq, base_offset, first_seq, ...},
--    x = the producer's transaction here, if any:
--        {n = transaction number, e = epoch, f = first offset of its data (nil: none yet)},
--    l = the number of the last transaction a marker ended here (nil: none)}
--
-- Stored in one of two encodings, told apart by the first byte:
-- * JSON ('{'): every layout. Gateways before layout 3 read and write
--   only this.
-- * compact (byte 1), from layout 3 on; less than half of JSON's cost to
--   decode and encode (benchmark/README.md, issue #14, twelfth round).
--   Big-endian:
--     1 (the encoding), flags (1: x, 2: x.f, 4: l), e i4, t i8,
--     [x.n i8, x.e i4, [x.f i8]], [l i8],
--     the number of batches (one byte), then each: first_seq i4, last_seq i4, base i8.
-- A gateway writes the compact encoding only once the layout is 3
-- (storage/src/layout.rs): until then a gateway of an older release may read the
-- state. The file is prepended to each script that reads the state.
local function decode_state(s)
  if string.byte(s, 1) == 123 then
    local state = cjson.decode(s)
    local flat = {}
    for i, b in ipairs(state.b) do
      flat[3 * i - 2], flat[3 * i - 1], flat[3 * i] = b[1], b[2], b[3]
    end
    state.b = flat
    return state
  end
  local encoding, flags, e, t, pos = struct.unpack('>BBi4i8', s)
  if encoding ~= 1 then
    error('producer state: unknown encoding ' .. encoding)
  end
  local state = {e = e, t = t}
  if flags % 2 == 1 then
    local n, xe
    n, xe, pos = struct.unpack('>i8i4', s, pos)
    state.x = {n = n, e = xe}
    if math.floor(flags / 2) % 2 == 1 then
      state.x.f, pos = struct.unpack('>i8', s, pos)
    end
  end
  if math.floor(flags / 4) % 2 == 1 then
    state.l, pos = struct.unpack('>i8', s, pos)
  end
  local count = string.byte(s, pos)
  if count == 0 then
    state.b = {}
  else
    state.b = {struct.unpack('>' .. string.rep('i4i4i8', count), s, pos + 1)}
    -- unpack's last value is the position after the batches.
    state.b[3 * count + 1] = nil
  end
  return state
end

-- `compact`: the script's argument saying the layout allows the compact
-- encoding ('1'), else JSON.
local function encode_state(state, compact)
  local b = state.b
  if compact ~= '1' then
    local nested = {}
    for i = 1, #b, 3 do
      nested[#nested + 1] = {b[i], b[i + 1], b[i + 2]}
    end
    local json = {e = state.e, t = state.t, b = nested, x = state.x, l = state.l}
    -- cjson writes an empty table as an object: an array stays an array.
    return #nested == 0 and string.gsub(cjson.encode(json), '"b":{}', '"b":[]', 1) or cjson.encode(json)
  end
  local x, l = state.x, state.l
  local flags = (x and 1 or 0) + ((x and x.f) and 2 or 0) + (l and 4 or 0)
  local head = struct.pack('>BBi4i8', 1, flags, state.e, state.t or 0)
  if x then
    head = head .. struct.pack('>i8i4', x.n, x.e)
    if x.f then
      head = head .. struct.pack('>i8', x.f)
    end
  end
  if l then
    head = head .. struct.pack('>i8', l)
  end
  local count = #b / 3
  if count == 0 then
    return head .. '\0'
  end
  return head .. struct.pack('>B' .. string.rep('i4i4i8', count), count, unpack(b))
end
