#!lua flags=allow-oom
--[[
KEYS ready, leases, items; ARGV prefix, owner, now, expiry, then the ids.

Leases to owner, until expiry, those of the items named that are due at now and that
no unexpired lease holds, as claim does. An id of no item, of an item not due yet or
of one leased is passed over. Returns the fields of each item claimed, oldest first.
]]
local prefix, owner, expiry = ARGV[1], ARGV[2], ARGV[4]
local now = tonumber(ARGV[3])

local claimed = {}
for i = 5, #ARGV do
    local item = prefix .. 'item:' .. ARGV[i]
    local fields = redis.call('HMGET', item, 'member', 'owner', 'expires', 'next')
    local member = fields[1]
    local free = not fields[2] or tonumber(fields[3]) <= now
    if member and free and tonumber(fields[4]) <= now then
        -- The lease doubles as the retry time: a crashed worker's item falls due by itself.
        redis.call('HSET', item, 'owner', owner, 'expires', expiry, 'next', expiry)
        redis.call('ZREM', KEYS[1], member)
        redis.call('ZADD', KEYS[2], expiry, member)
        redis.call('ZADD', KEYS[3], expiry, member)
        claimed[#claimed + 1] = {member = member, fields = redis.call('HGETALL', item)}
    end
end
-- A member starts with the item's sequence number, zero-padded: oldest sorts first.
table.sort(claimed, function(a, b)
    return a.member < b.member
end)
local replies = {}
for _, entry in ipairs(claimed) do
    replies[#replies + 1] = entry.fields
end
return replies
