local n = tonumber(ARGV[1])
local mode = ARGV[2]
local s = '{"e":0,"b":[[100,100,1000],[101,101,1001],[102,102,1002],[103,103,1003],[104,104,1004]],"t":1764888000123}'
local st = cjson.decode(s)
local t0 = redis.call('TIME')
local x
for i = 1, n do
  if mode == 'decode' then x = cjson.decode(s)
  elseif mode == 'encode' then x = cjson.encode(st)
  elseif mode == 'format' then
    local b = st.b
    x = string.format('{"e":%d,"t":%d,"b":[[%d,%d,%d],[%d,%d,%d],[%d,%d,%d],[%d,%d,%d],[%d,%d,%d]]}', st.e, st.t,
      b[1][1], b[1][2], b[1][3], b[2][1], b[2][2], b[2][3], b[3][1], b[3][2], b[3][3], b[4][1], b[4][2], b[4][3], b[5][1], b[5][2], b[5][3])
  elseif mode == 'concat' then
    local parts = {}
    for j, b in ipairs(st.b) do parts[j] = '[' .. b[1] .. ',' .. b[2] .. ',' .. b[3] .. ']' end
    x = '{"e":' .. st.e .. ',"t":' .. st.t .. ',"b":[' .. table.concat(parts, ',') .. ']}'
  elseif mode == 'match' then
    local e, t, rest = string.match(s, '^{"e":(%d+),"b":%[(.-)%],"t":(%d+)}$')
    local b = {}
    for a1, a2, a3 in string.gmatch(t, '%[(%d+),(%d+),(%d+)%]') do b[#b + 1] = {tonumber(a1), tonumber(a2), tonumber(a3)} end
    x = {e = tonumber(e), t = tonumber(rest), b = b}
  elseif mode == 'pack' then
    local b = st.b
    x = struct.pack('>i4i8i4i4i8i4i4i8i4i4i8i4i4i8i4i4i8', st.e, st.t, b[1][1], b[1][2], b[1][3], b[2][1], b[2][2], b[2][3], b[3][1], b[3][2], b[3][3], b[4][1], b[4][2], b[4][3], b[5][1], b[5][2], b[5][3])
  elseif mode == 'none' then x = s
  end
end
local t1 = redis.call('TIME')
return tostring(((t1[1] - t0[1]) * 1e6 + (t1[2] - t0[2])) / n * 1000) .. ' ns'
