#!lua flags=no-writes
--[[
KEYS items; ARGV prefix, cursor, count.

A step of ZSCAN over every item, each its fields, in one read: {the next cursor ('0'
once every item was read), the fields of each item of the step}. ZSCAN's cursor
changes with no write, so an item present from the first step to the last is met at
least once, however the items' scores change meanwhile. An item whose hash is gone is
left out.
]]
local step = redis.call('ZSCAN', KEYS[1], ARGV[2], 'COUNT', ARGV[3])
local page = {}
for i = 1, #step[2], 2 do
    local fields = redis.call('HGETALL', ARGV[1] .. 'item:' .. string.sub(step[2][i], 18))
    if #fields > 0 then
        page[#page + 1] = fields
    end
end
return {step[1], page}
