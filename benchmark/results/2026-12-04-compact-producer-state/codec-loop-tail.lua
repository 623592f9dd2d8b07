local n = tonumber(ARGV[1])
local mode = ARGV[2]
local s = '{"e":0,"b":[[100,100,1000],[101,101,1001],[102,102,1002],[103,103,1003],[104,104,1004]],"t":1764888000123}'
local st = decode_state(s)
local packed = encode_state(st, '1')
local t0 = redis.call('TIME')
local x
for i = 1, n do
  if mode == 'jdec' then x = decode_state(s)
  elseif mode == 'jenc' then x = encode_state(st, '0')
  elseif mode == 'cdec' then x = decode_state(packed)
  elseif mode == 'cenc' then x = encode_state(st, '1')
  elseif mode == 'rt' then x = cjson.encode(decode_state(encode_state(decode_state(s), '1')))
  end
end
local t1 = redis.call('TIME')
return tostring(((t1[1] - t0[1]) * 1e6 + (t1[2] - t0[2])) / n * 1000) .. ' ns ' .. #packed .. ' ' .. cjson.encode(decode_state(packed)) .. ' ' .. encode_state(decode_state(packed), '0')
