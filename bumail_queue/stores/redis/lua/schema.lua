#!lua flags=allow-oom
--[[
KEYS schema; ARGV version.

Writes the layout version on a new queue and returns the one found: the version, or
'' when the key holds something else (another application's key under this prefix).
]]
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then
    redis.call('SET', KEYS[1], ARGV[1])
    return ARGV[1]
end
if kind ~= 'string' then
    return ''
end
return redis.call('GET', KEYS[1])
