#!lua flags=allow-oom
--[[
KEYS schema; ARGV version, prefix.

Writes the layout version on a new queue and returns the one found: the version, or
'' when the key holds something else (another application's key under this prefix).

A queue of layout 1 is brought to layout 2 on the way: its one sorted set of the
items no lease holds, 'ready', becomes the ready set of the lane '0:default', where
every item of layout 1 is (it has no priority and no channel). A rename: as quick
for a million items as for one.
]]
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then
    redis.call('SET', KEYS[1], ARGV[1])
    return ARGV[1]
end
if kind ~= 'string' then
    return ''
end
local found = redis.call('GET', KEYS[1])
if found == '1' and ARGV[1] == '2' then
    local prefix = ARGV[2]
    if redis.call('EXISTS', prefix .. 'ready') == 1 then
        redis.call('RENAME', prefix .. 'ready', prefix .. 'ready:0:default')
        redis.call('SADD', prefix .. 'lanes', '0:default')
    end
    redis.call('SET', KEYS[1], ARGV[1])
    return ARGV[1]
end
return found
