--[[
The lanes, put by scripts.py before every script that moves an item in or out of them.

An item's lane is its priority and its channel, written '<priority>:<channel>' (an
item written before lanes existed has neither field, and is in '0:default'). The
items of a lane that no lease holds are the sorted set ready:<lane>, scored by their
next attempt. The set 'lanes' names every lane whose ready set holds an item: a lane
joins it with each item that enters its ready set, and leaves it with the last one
that leaves (the claim also takes out a lane whose ready set is gone).
]]
local function lane_of(priority, channel)
    return (priority or '0') .. ':' .. (channel or 'default')
end

local function make_ready(prefix, lane, score, member)
    redis.call('ZADD', prefix .. 'ready:' .. lane, score, member)
    redis.call('SADD', prefix .. 'lanes', lane)
end

local function unready(prefix, lane, member)
    local ready = prefix .. 'ready:' .. lane
    redis.call('ZREM', ready, member)
    if redis.call('ZCARD', ready) == 0 then
        redis.call('SREM', prefix .. 'lanes', lane)
    end
end
