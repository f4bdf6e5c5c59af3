#!lua flags=allow-oom
--[[
KEYS items, leases, keys; ARGV prefix, id.

Drops the item and its message; returns the item's fields as it stood, or false.
]]
local prefix, id = ARGV[1], ARGV[2]
local item = prefix .. 'item:' .. id
local fields = redis.call('HGETALL', item)
redis.call('DEL', prefix .. 'message:' .. id)
if #fields == 0 then
    return false
end
local kept = redis.call('HMGET', item, 'member', 'key', 'priority', 'channel')
redis.call('DEL', item)
redis.call('ZREM', KEYS[1], kept[1])
unready(prefix, lane_of(kept[3], kept[4]), kept[1])
redis.call('ZREM', KEYS[2], kept[1])
if kept[2] and redis.call('HGET', KEYS[3], kept[2]) == id then
    redis.call('HDEL', KEYS[3], kept[2])
end
return fields
