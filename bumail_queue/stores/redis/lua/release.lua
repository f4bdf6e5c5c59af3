#!lua flags=allow-oom
--[[
KEYS items; ARGV prefix, now, held (the score of HELD_AT), wake channel, then the ids.

Makes each held item due at now, back in its lane's ready set. Returns a status per
id: 1 released, 2 not held, -1 no such item. Idle workers are told when one was.
]]
local prefix, now, held = ARGV[1], ARGV[2], tonumber(ARGV[3])
local statuses, released = {}, 0
for i = 5, #ARGV do
    local item = prefix .. 'item:' .. ARGV[i]
    local fields = redis.call('HMGET', item, 'member', 'next', 'priority', 'channel')
    local member = fields[1]
    local status
    if not member then
        status = -1
    elseif tonumber(fields[2]) < held then
        status = 2
    else
        redis.call('HSET', item, 'next', now)
        redis.call('ZADD', KEYS[1], now, member)
        make_ready(prefix, lane_of(fields[3], fields[4]), now, member)
        released = released + 1
        status = 1
    end
    statuses[#statuses + 1] = status
end
if released > 0 then
    redis.call('PUBLISH', ARGV[4], '')
end
return statuses
