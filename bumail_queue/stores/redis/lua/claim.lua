#!lua flags=allow-oom
--[[
KEYS leases, items, turn; ARGV prefix, owner, now, expiry, limit.

Leases to owner, until expiry, up to limit items due at now, in the order of
items.fair_order: channels in turn, the higher priority first, then the channels
round-robin from the one after turn (the channel the last claim ended with), which
moves on to the channel served last. The candidates are the first limit due items of each lane's
ready set (a lane's items no lease holds), and the items whose lease expired by now
and whose next attempt has come. The expired leases are read whole: there are only
as many as the leases a crashed or stalled worker left behind, and the leased items
retried later than their lease's end, until they are due. A lane whose ready set is
gone leaves the lanes. An item whose hash is gone (evicted, or deleted by hand) is
dropped with its message, never leased. Returns the fields of each item claimed.
]]
local prefix, owner, expiry = ARGV[1], ARGV[2], ARGV[4]
local now, limit = tonumber(ARGV[3]), tonumber(ARGV[5])

local function drop(member, lane)
    local id = string.sub(member, 18)
    if lane then
        unready(prefix, lane, member)
    end
    redis.call('ZREM', KEYS[1], member)
    redis.call('ZREM', KEYS[2], member)
    redis.call('DEL', prefix .. 'message:' .. id)
end

-- Each candidate: {member, due, priority, channel, lane (nil when leased)}.
local candidates = {}
for _, lane in ipairs(redis.call('SMEMBERS', prefix .. 'lanes')) do
    local ready = prefix .. 'ready:' .. lane
    if redis.call('EXISTS', ready) == 0 then
        redis.call('SREM', prefix .. 'lanes', lane)
    else
        local priority, channel = string.match(lane, '^(-?%d+):(.*)$')
        local front = redis.call('ZRANGEBYSCORE', ready, '-inf', ARGV[3], 'WITHSCORES', 'LIMIT', 0, limit)
        for i = 1, #front, 2 do
            candidates[#candidates + 1] = {front[i], tonumber(front[i + 1]), tonumber(priority), channel, lane}
        end
    end
end
for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[3])) do
    local fields = redis.call('HMGET', prefix .. 'item:' .. string.sub(member, 18), 'next', 'priority', 'channel')
    if not fields[1] then
        drop(member, nil)
    elseif tonumber(fields[1]) <= now then
        candidates[#candidates + 1] = {member, tonumber(fields[1]), tonumber(fields[2] or '0'), fields[3] or 'default'}
    end
end

-- Channel names compare byte by byte, as in every store (Lua's < follows the locale).
local function byte_less(a, b)
    for i = 1, math.min(#a, #b) do
        local x, y = string.byte(a, i), string.byte(b, i)
        if x ~= y then
            return x < y
        end
    end
    return #a < #b
end

-- items.fair_order: rank each channel's candidates, then take turns.
local after = redis.call('GET', KEYS[3]) or ''
local function before(a, b)
    if a[3] ~= b[3] then
        return a[3] > b[3]
    end
    if a[2] ~= b[2] then
        return a[2] < b[2]
    end
    return a[1] < b[1]
end
local by_channel = {}
for _, candidate in ipairs(candidates) do
    local channel = candidate[4]
    by_channel[channel] = by_channel[channel] or {}
    table.insert(by_channel[channel], candidate)
end
local ranked = {}
for channel, list in pairs(by_channel) do
    table.sort(list, before)
    local wrapped = not byte_less(after, channel)
    for turn = 1, math.min(#list, limit) do
        list[turn].turn = turn
        list[turn].wrapped = wrapped
        ranked[#ranked + 1] = list[turn]
    end
end
table.sort(ranked, function(a, b)
    if a.turn ~= b.turn then
        return a.turn < b.turn
    end
    if a[3] ~= b[3] then
        return a[3] > b[3]
    end
    if a.wrapped ~= b.wrapped then
        return b.wrapped
    end
    return byte_less(a[4], b[4])
end)

local claimed, last_channel = {}, nil
for _, candidate in ipairs(ranked) do
    if #claimed >= limit then
        break
    end
    local member, lane = candidate[1], candidate[5]
    local item = prefix .. 'item:' .. string.sub(member, 18)
    if redis.call('EXISTS', item) == 0 then
        drop(member, lane)
    else
        -- The lease doubles as the retry time: a crashed worker's item falls due by itself.
        redis.call('HSET', item, 'owner', owner, 'expires', expiry, 'next', expiry)
        if lane then
            unready(prefix, lane, member)
        end
        redis.call('ZADD', KEYS[1], expiry, member)
        redis.call('ZADD', KEYS[2], expiry, member)
        claimed[#claimed + 1] = redis.call('HGETALL', item)
        last_channel = candidate[4]
    end
end
if last_channel then
    redis.call('SET', KEYS[3], last_channel)
end
return claimed
