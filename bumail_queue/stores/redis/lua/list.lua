#!lua flags=no-writes
--[[
KEYS items; ARGV prefix, first, last.

A page of items, earliest due first, then oldest, each its fields, in one read. An
item whose hash is gone is left out (the next claim that meets it drops it).
]]
local page = {}
for _, member in ipairs(redis.call('ZRANGE', KEYS[1], ARGV[2], ARGV[3])) do
    local fields = redis.call('HGETALL', ARGV[1] .. 'item:' .. string.sub(member, 18))
    if #fields > 0 then
        page[#page + 1] = fields
    end
end
return page
