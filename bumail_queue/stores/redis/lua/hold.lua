#!lua flags=allow-oom
--[[
KEYS items, leases; ARGV prefix, now, held (the score of HELD_AT), then the ids.

Holds each item: its next attempt becomes `held`, it leaves its lane's ready set (so
no claim meets it) and any ended lease. Returns a status per id: 1 held, 0 left to the
lease that holds it at now, 2 held already, -1 no such item.
]]
local prefix, now, held = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local statuses = {}
for i = 4, #ARGV do
    local item = prefix .. 'item:' .. ARGV[i]
    local fields = redis.call('HMGET', item, 'member', 'owner', 'expires', 'next', 'priority', 'channel')
    local member, owner = fields[1], fields[2]
    local status
    if not member then
        status = -1
    elseif owner and tonumber(fields[3]) > now then
        status = 0
    elseif tonumber(fields[4]) >= tonumber(held) then
        status = 2
    else
        redis.call('HSET', item, 'next', held)
        redis.call('HDEL', item, 'owner', 'expires')
        redis.call('ZADD', KEYS[1], held, member)
        redis.call('ZREM', KEYS[2], member)
        unready(prefix, lane_of(fields[5], fields[6]), member)
        status = 1
    end
    statuses[#statuses + 1] = status
end
return statuses
