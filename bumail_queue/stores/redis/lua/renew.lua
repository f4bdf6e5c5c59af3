#!lua flags=allow-oom
--[[
KEYS leases, items; ARGV prefix, id, owner, expiry.

1 while the owner holds the lease, which now ends at expiry (and the item falls due
then, as at a claim); else 0. A renewal leaves rev alone: it never makes an outcome
being recorded read the item again.
]]
local item = ARGV[1] .. 'item:' .. ARGV[2]
local fields = redis.call('HMGET', item, 'owner', 'member')
if fields[1] ~= ARGV[3] or not fields[2] then
    return 0
end
redis.call('HSET', item, 'expires', ARGV[4], 'next', ARGV[4])
redis.call('ZADD', KEYS[1], ARGV[4], fields[2])
redis.call('ZADD', KEYS[2], ARGV[4], fields[2])
return 1
