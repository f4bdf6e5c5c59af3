#!lua flags=no-writes
--[[
KEYS suppressed, created; ARGV now, text ('' for none), offset, limit, whether a
scope is asked ('1' or '0'), the scope, the reason ('' for any).

A page of the entries in force, the newest first (equal times in reverse order of
member), each its member and its entry; with a text, only the addresses that hold
it, ASCII case aside (the text comes lowercase); with a scope or a reason, only the
entries of it. Reads the list from its newest entry until the page is full.
]]
local now, text = tonumber(ARGV[1]), ARGV[2]
local skip, limit = tonumber(ARGV[3]), tonumber(ARGV[4])
local scope_asked, scope, reason = ARGV[5] == '1', ARGV[6], ARGV[7]

local function wanted(member, entry)
    local address = member
    local line_end = string.find(member, '\n', 1, true)
    if line_end then
        address = string.sub(member, 1, line_end - 1)
    end
    if text ~= '' and not string.find(string.lower(address), text, 1, true) then
        return false
    end
    local data = cjson.decode(entry)
    if tonumber(data['expires']) <= now then
        return false
    end
    if scope_asked and (data['scope'] or '') ~= scope then
        return false
    end
    return reason == '' or data['reason'] == reason
end

local page, start, chunk = {}, 0, 500
while #page < 2 * limit do
    local members = redis.call('ZREVRANGE', KEYS[2], start, start + chunk - 1)
    if #members == 0 then
        break
    end
    local entries = redis.call('HMGET', KEYS[1], unpack(members))
    for n, member in ipairs(members) do
        local entry = entries[n]
        if entry and wanted(member, entry) then
            if skip > 0 then
                skip = skip - 1
            elseif #page < 2 * limit then
                page[#page + 1] = member
                page[#page + 1] = entry
            end
        end
    end
    start = start + chunk
end
return page
