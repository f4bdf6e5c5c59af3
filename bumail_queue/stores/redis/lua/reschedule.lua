#!lua flags=allow-oom
--[[
KEYS items, leases; ARGV prefix, id, at, owner ('' for none), wake channel.

With an owner, only while it holds the lease, which it lets go of (a stopping worker
giving back what it did not start); without one, a lease stays, and the item falls
due at `at` once the lease has ended. 1 when moved, and idle workers are told; else 0.
]]
local prefix = ARGV[1]
local item = prefix .. 'item:' .. ARGV[2]
local at, owner = ARGV[3], ARGV[4]
local fields = redis.call('HMGET', item, 'owner', 'member', 'priority', 'channel')
local member = fields[2]
if not member then
    return 0
end
local lane = lane_of(fields[3], fields[4])
if owner ~= '' then
    if fields[1] ~= owner then
        return 0
    end
    redis.call('HDEL', item, 'owner', 'expires')
    redis.call('ZREM', KEYS[2], member)
    make_ready(prefix, lane, at, member)
elseif not fields[1] then
    make_ready(prefix, lane, at, member)
end
redis.call('HSET', item, 'next', at)
redis.call('ZADD', KEYS[1], at, member)
redis.call('PUBLISH', ARGV[5], '')
return 1
