#!lua flags=allow-oom
--[[
KEYS ready, leases, items; ARGV prefix, owner, now, expiry, limit.

Leases to owner, until expiry, up to limit items due at now: of the items no lease
holds (ready), and of those whose lease expired by now and whose next attempt has
come. Earliest due first, then oldest. The expired leases are read whole: there are
only as many as the leases a crashed or stalled worker left behind, and the leased
items retried later than their lease's end, until they are due. An item whose hash
is gone (evicted, or deleted by hand) is dropped with its message, never leased.
Returns the fields of each item claimed.
]]
local prefix, owner, expiry = ARGV[1], ARGV[2], ARGV[4]
local now, limit = tonumber(ARGV[3]), tonumber(ARGV[5])

local function drop(member)
    local id = string.sub(member, 18)
    redis.call('ZREM', KEYS[1], member)
    redis.call('ZREM', KEYS[2], member)
    redis.call('ZREM', KEYS[3], member)
    redis.call('DEL', prefix .. 'message:' .. id)
end

local candidates = {}
local ready = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[3], 'WITHSCORES', 'LIMIT', 0, limit)
for i = 1, #ready, 2 do
    candidates[#candidates + 1] = {member = ready[i], due = tonumber(ready[i + 1])}
end
for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[3])) do
    local next = redis.call('HGET', prefix .. 'item:' .. string.sub(member, 18), 'next')
    if not next then
        drop(member)
    elseif tonumber(next) <= now then
        candidates[#candidates + 1] = {member = member, due = tonumber(next)}
    end
end
table.sort(candidates, function(a, b)
    if a.due ~= b.due then
        return a.due < b.due
    end
    return a.member < b.member
end)

local claimed = {}
for _, candidate in ipairs(candidates) do
    if #claimed >= limit then
        break
    end
    local member = candidate.member
    local item = prefix .. 'item:' .. string.sub(member, 18)
    if redis.call('EXISTS', item) == 0 then
        drop(member)
    else
        -- The lease doubles as the retry time: a crashed worker's item falls due by itself.
        redis.call('HSET', item, 'owner', owner, 'expires', expiry, 'next', expiry)
        redis.call('ZREM', KEYS[1], member)
        redis.call('ZADD', KEYS[2], expiry, member)
        redis.call('ZADD', KEYS[3], expiry, member)
        claimed[#claimed + 1] = redis.call('HGETALL', item)
    end
end
return claimed
