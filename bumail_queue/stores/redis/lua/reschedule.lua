#!lua flags=allow-oom
--[[
KEYS items, ready, leases; ARGV prefix, id, at, owner ('' for none), wake channel.

With an owner, only while it holds the lease, which it lets go of (a stopping worker
giving back what it did not start); without one, a lease stays, and the item falls
due at `at` once the lease has ended. 1 when moved, and idle workers are told; else 0.
]]
local item = ARGV[1] .. 'item:' .. ARGV[2]
local at, owner = ARGV[3], ARGV[4]
local fields = redis.call('HMGET', item, 'owner', 'member')
local member = fields[2]
if not member then
    return 0
end
if owner ~= '' then
    if fields[1] ~= owner then
        return 0
    end
    redis.call('HDEL', item, 'owner', 'expires')
    redis.call('ZREM', KEYS[3], member)
    redis.call('ZADD', KEYS[2], at, member)
elseif not fields[1] then
    redis.call('ZADD', KEYS[2], at, member)
end
redis.call('HSET', item, 'next', at)
redis.call('ZADD', KEYS[1], at, member)
redis.call('PUBLISH', ARGV[5], '')
return 1
