#!lua flags=allow-oom
--[[
KEYS leases, items, turn; ARGV prefix, owner, now, expiry, limit.

Leases to owner, until expiry, up to limit items due at now, in the order of
items.fair_order: channels in turn, the higher priority first, then the channels
round-robin from the one after turn (the channel the last claim ended with), which
moves on to the channel served last. It counts each lane's due items (ZCOUNT, in its
ready set: the lane's items no lease holds), takes the items whose lease expired by
now and whose next attempt has come, works out each one's share of the claim as
items.fair_shares does, and reads only those: a ZCOUNT per lane and the items it
takes, whatever the number of items due. The expired leases are read whole: there are only
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

-- The order of a claim's turns (items.fair_order): the turn, then the higher
-- priority, then the channels round-robin from the one after `after` (those whose
-- names come after it, then the others), each by name.
local function in_turn_order(a, b)
    if a.turn ~= b.turn then
        return a.turn < b.turn
    end
    if a.priority ~= b.priority then
        return a.priority > b.priority
    end
    if a.wrapped ~= b.wrapped then
        return b.wrapped
    end
    return byte_less(a.channel, b.channel)
end

-- The sources of due items, by channel: a lane's ready set with how many it has due
-- (ZCOUNT, as far as the limit), or an item whose lease expired.
local sources, totals = {}, {}
local function add_source(channel, source)
    sources[channel] = sources[channel] or {}
    table.insert(sources[channel], source)
    totals[channel] = math.min(limit, (totals[channel] or 0) + source.due)
end
for _, lane in ipairs(redis.call('SMEMBERS', prefix .. 'lanes')) do
    local ready = prefix .. 'ready:' .. lane
    if redis.call('EXISTS', ready) == 0 then
        redis.call('SREM', prefix .. 'lanes', lane)
    else
        local due = redis.call('ZCOUNT', ready, '-inf', ARGV[3])
        if due > 0 then
            local priority, channel = string.match(lane, '^(-?%d+):(.*)$')
            add_source(channel, {priority = tonumber(priority), due = math.min(due, limit), lane = lane})
        end
    end
end
for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[3])) do
    local fields = redis.call('HMGET', prefix .. 'item:' .. string.sub(member, 18), 'next', 'priority', 'channel')
    if not fields[1] then
        drop(member, nil)
    elseif tonumber(fields[1]) <= now then
        add_source(fields[3] or 'default', {
            priority = tonumber(fields[2] or '0'), due = 1, member = member, at = tonumber(fields[1]),
        })
    end
end

-- items.fair_shares: how many of each source the claim takes. The turns it reaches
-- are the fewest whose items fill it, found by bisection.
local after = redis.call('GET', KEYS[3]) or ''
local available, turns = 0, limit
for _, total in pairs(totals) do
    available = available + total
end
if available > limit then
    local low, high = 1, limit
    while low < high do
        local middle = math.floor((low + high) / 2)
        local filled = 0
        for _, total in pairs(totals) do
            filled = filled + math.min(total, middle)
        end
        if filled >= limit then
            high = middle
        else
            low = middle + 1
        end
    end
    turns = low
end
local slots = {}
for channel, list in pairs(sources) do
    -- The higher priority first; an expired lease before a lane of its priority.
    table.sort(list, function(a, b)
        if a.priority ~= b.priority then
            return a.priority > b.priority
        end
        return a.member ~= nil and b.member == nil
    end)
    local wrapped, turn = not byte_less(after, channel), 0
    for _, source in ipairs(list) do
        source.take = 0
        for _ = 1, math.min(source.due, turns - turn) do
            turn = turn + 1
            slots[#slots + 1] = {
                turn = turn, priority = source.priority, wrapped = wrapped, channel = channel, source = source,
            }
        end
    end
end
table.sort(slots, in_turn_order)
for i = 1, math.min(#slots, limit) do
    slots[i].source.take = slots[i].source.take + 1
end

-- What each source gives, its first items due, by channel: {member, due, priority,
-- channel, lane (nil when leased)}.
local by_channel = {}
for channel, list in pairs(sources) do
    by_channel[channel] = {}
    for _, source in ipairs(list) do
        if source.take > 0 and source.member then
            table.insert(by_channel[channel], {
                member = source.member, due = source.at, priority = source.priority, channel = channel,
            })
        elseif source.take > 0 then
            local front = redis.call('ZRANGEBYSCORE', prefix .. 'ready:' .. source.lane, '-inf', ARGV[3],
                'WITHSCORES', 'LIMIT', 0, source.take)
            for i = 1, #front, 2 do
                table.insert(by_channel[channel], {
                    member = front[i], due = tonumber(front[i + 1]), priority = source.priority, channel = channel,
                    lane = source.lane,
                })
            end
        end
    end
end

-- items.fair_order: rank each channel's items (the higher priority, the earliest due,
-- the oldest first), then take turns.
local ranked = {}
for channel, list in pairs(by_channel) do
    table.sort(list, function(a, b)
        if a.priority ~= b.priority then
            return a.priority > b.priority
        end
        if a.due ~= b.due then
            return a.due < b.due
        end
        return a.member < b.member
    end)
    local wrapped = not byte_less(after, channel)
    for turn, candidate in ipairs(list) do
        candidate.turn, candidate.wrapped = turn, wrapped
        ranked[#ranked + 1] = candidate
    end
end
table.sort(ranked, in_turn_order)

local claimed, last_channel = {}, nil
for _, candidate in ipairs(ranked) do
    if #claimed >= limit then
        break
    end
    local member, lane = candidate.member, candidate.lane
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
        last_channel = candidate.channel
    end
end
if last_channel then
    redis.call('SET', KEYS[3], last_channel)
end
return claimed
