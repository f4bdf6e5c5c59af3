#!lua flags=allow-oom
--[[
KEYS items; ARGV prefix, now, wake channel, then 'ids' and the ids; or 'waiting',
the score to go on from, how many items of that score to pass over, how many to read,
the score of a held item (HELD_AT: a held item is left held), and the spellings of a
domain (none: any domain).

Makes items due at now, as reschedule does without an owner, but leaves an item a
lease holds at now to its worker, and never makes an item due later than it was.

'ids': the items named, whatever their recipients' state. Returns a status per id: 1
due now, 0 left to its lease, -1 no such item.

'waiting': a page of the items not due yet (scored above now in items, earliest
first), each moved when no lease holds it and a recipient is deferred, at a domain
that is, lowercased, one of the spellings. A moved item leaves the page's range, so
the next page starts at the last score read, past the items of that score kept.
Returns {1 when the range is read to its end, the last score read, how many items
of it were kept, how many moved, the ids of the items kept with a deferred recipient
at a non-ASCII domain, for the caller to compare as it compares domains}.

Idle workers are told when an item was made due.
]]
local prefix, now, stamp = ARGV[1], tonumber(ARGV[2]), ARGV[2]

local function make_due(id)
    local item = prefix .. 'item:' .. id
    local fields = redis.call('HMGET', item, 'member', 'owner', 'expires', 'next', 'priority', 'channel')
    local member, owner = fields[1], fields[2]
    if not member then
        return -1
    end
    if owner and tonumber(fields[3]) > now then
        return 0
    end
    if tonumber(fields[4]) > now then
        redis.call('HSET', item, 'next', stamp)
        redis.call('ZADD', KEYS[1], stamp, member)
        if not owner then
            make_ready(prefix, lane_of(fields[5], fields[6]), stamp, member)
        end
    end
    return 1
end

-- 'yes' for a deferred recipient at one of the spellings (any, without them); 'maybe'
-- when a deferred one's domain is not ASCII, which only the caller can compare.
local function deferred_at(recipients, spelled, any_domain)
    local verdict = 'no'
    for _, recipient in ipairs(recipients) do
        if recipient.status == 'deferred' then
            if any_domain then
                return 'yes'
            end
            local domain = string.lower(string.match(recipient.address, '[^@]*$'))
            if spelled[domain] then
                return 'yes'
            end
            if string.find(domain, '[\128-\255]') then
                verdict = 'maybe'
            end
        end
    end
    return verdict
end

local made_due = 0
if ARGV[4] == 'ids' then
    local statuses = {}
    for i = 5, #ARGV do
        statuses[#statuses + 1] = make_due(ARGV[i])
        if statuses[#statuses] == 1 then
            made_due = made_due + 1
        end
    end
    if made_due > 0 then
        redis.call('PUBLISH', ARGV[3], '')
    end
    return statuses
end

local from, skip, size = ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
local spelled = {}
for i = 9, #ARGV do
    spelled[ARGV[i]] = true
end
local any_domain = #ARGV < 9
local page = redis.call('ZRANGEBYSCORE', KEYS[1], from, '(' .. ARGV[8], 'WITHSCORES', 'LIMIT', skip, size)
local last, kept, unsure = from, skip, {}
for i = 1, #page, 2 do
    local member, score = page[i], page[i + 1]
    if score ~= last then
        last, kept = score, 0
    end
    local id = string.sub(member, 18)
    local fields = redis.call('HMGET', prefix .. 'item:' .. id, 'owner', 'expires', 'recipients')
    local verdict = 'no'
    if fields[3] and not (fields[1] and tonumber(fields[2]) > now) then
        verdict = deferred_at(cjson.decode(fields[3]), spelled, any_domain)
    end
    if verdict == 'yes' and make_due(id) == 1 then
        made_due = made_due + 1
    else
        kept = kept + 1
        if verdict == 'maybe' then
            unsure[#unsure + 1] = id
        end
    end
end
if made_due > 0 then
    redis.call('PUBLISH', ARGV[3], '')
end
return {#page < 2 * size and 1 or 0, last, kept, made_due, unsure}
