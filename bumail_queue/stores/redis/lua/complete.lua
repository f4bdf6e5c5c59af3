#!lua flags=allow-oom
--[[
KEYS items, leases, keys; ARGV prefix, id, owner, rev, then 'drop', or 'record' and
recipients, next, attempts, delay.

0 when the owner does not hold the lease; -1 when another outcome was recorded since
the item was read at rev (read it again); -2 when the item is gone; 1 once recorded
and the lease let go of (the item back in its lane), or the item dropped with its
message.
]]
local prefix, id = ARGV[1], ARGV[2]
local item = prefix .. 'item:' .. id
local fields = redis.call('HMGET', item, 'owner', 'rev', 'member', 'key', 'priority', 'channel')
local member = fields[3]
if not member then
    return -2
end
if fields[1] ~= ARGV[3] then
    return 0
end
if fields[2] ~= ARGV[4] then
    return -1
end
local lane = lane_of(fields[5], fields[6])
if ARGV[5] == 'drop' then
    redis.call('DEL', item, prefix .. 'message:' .. id)
    redis.call('ZREM', KEYS[1], member)
    redis.call('ZREM', KEYS[2], member)
    unready(prefix, lane, member)
    if fields[4] and redis.call('HGET', KEYS[3], fields[4]) == id then
        redis.call('HDEL', KEYS[3], fields[4])
    end
    return 1
end
redis.call('HSET', item, 'recipients', ARGV[6], 'next', ARGV[7], 'attempts', ARGV[8], 'delay', ARGV[9])
redis.call('HDEL', item, 'owner', 'expires')
redis.call('HINCRBY', item, 'rev', 1)
redis.call('ZREM', KEYS[2], member)
make_ready(prefix, lane, ARGV[7], member)
redis.call('ZADD', KEYS[1], ARGV[7], member)
return 1
