#!lua flags=no-writes
--[[
KEYS suppressed, created; ARGV now, text ('' for none), offset, limit.

A page of the entries in force, the newest first (equal times in reverse order of
address), each its address and its entry; with a text, only the addresses that hold
it, ASCII case aside (the text comes lowercase). Reads the list from its newest
entry until the page is full.
]]
local now, text = tonumber(ARGV[1]), ARGV[2]
local skip, limit = tonumber(ARGV[3]), tonumber(ARGV[4])
local page, start, chunk = {}, 0, 500
while #page < 2 * limit do
    local addresses = redis.call('ZREVRANGE', KEYS[2], start, start + chunk - 1)
    if #addresses == 0 then
        break
    end
    local entries = redis.call('HMGET', KEYS[1], unpack(addresses))
    for n, address in ipairs(addresses) do
        local entry = entries[n]
        if entry and (text == '' or string.find(string.lower(address), text, 1, true))
            and tonumber(cjson.decode(entry)['expires']) > now then
            if skip > 0 then
                skip = skip - 1
            elseif #page < 2 * limit then
                page[#page + 1] = address
                page[#page + 1] = entry
            end
        end
    end
    start = start + chunk
end
return page
