#!lua flags=no-writes
--[[
KEYS leases; ARGV prefix.

The lanes that hold an item, each '<priority>:<channel>' once: those whose ready set
holds one, and those of the items a lease holds (no more than the workers have in
hand).
]]
local prefix = ARGV[1]
local seen, held = {}, {}
local function hold(lane)
    if not seen[lane] then
        seen[lane] = true
        held[#held + 1] = lane
    end
end
for _, lane in ipairs(redis.call('SMEMBERS', prefix .. 'lanes')) do
    if redis.call('EXISTS', prefix .. 'ready:' .. lane) == 1 then
        hold(lane)
    end
end
for _, member in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
    local fields = redis.call('HMGET', prefix .. 'item:' .. string.sub(member, 18), 'id', 'priority', 'channel')
    if fields[1] then
        hold(lane_of(fields[2], fields[3]))
    end
end
return held
