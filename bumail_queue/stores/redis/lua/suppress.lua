#!lua
--[[
KEYS suppressed, expires, created, notes, scopes; ARGV now, note-until ('' for no
note), the count of entries to add then four each (member, entry, created, expires),
the count of expiries then four each as well, the count of delivered addresses then
each, then the members to take off.

The suppression list in one step. A member is an address (its global entry) or an
address, a line end and a scope. An entry is added, or replaces the member's own; a
scope's first entry adds the scope to the scopes set. An expiry (always global) of an
address whose entry is in force changes nothing; with a note still lasting it adds
its entry; otherwise it is noted until note-until. A delivered address loses its note,
and its global entry if a delivery disproves it (reason failed or expired); a member
taken off loses its entry and its note, whatever its reason. Adding drops up to 100 entries and notes that expired on the way.
Returns {addresses an expiry added, members taken off whose entries were in force}.
]]
local now = tonumber(ARGV[1])
local note_until = ARGV[2]

local function put(member, entry, created, expires)
    redis.call('HSET', KEYS[1], member, entry)
    redis.call('ZADD', KEYS[2], expires, member)
    redis.call('ZADD', KEYS[3], created, member)
    local line_end = string.find(member, '\n', 1, true)
    if line_end then
        redis.call('SADD', KEYS[5], string.sub(member, line_end + 1))
    else
        redis.call('ZREM', KEYS[4], member)
    end
end

local function drop(address)
    redis.call('HDEL', KEYS[1], address)
    redis.call('ZREM', KEYS[2], address)
    redis.call('ZREM', KEYS[3], address)
end

local function in_force(score)
    return score and tonumber(score) > now
end

local i = 3
local added = tonumber(ARGV[i])
i = i + 1
for _ = 1, added do
    put(ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3])
    i = i + 4
end

local promoted = {}
local expiries = tonumber(ARGV[i])
i = i + 1
for _ = 1, expiries do
    local address = ARGV[i]
    if not in_force(redis.call('ZSCORE', KEYS[2], address)) then
        if in_force(redis.call('ZSCORE', KEYS[4], address)) then
            put(address, ARGV[i + 1], ARGV[i + 2], ARGV[i + 3])
            promoted[#promoted + 1] = address
        elseif note_until ~= '' then
            redis.call('ZADD', KEYS[4], note_until, address)
        end
    end
    i = i + 4
end

local removed = {}
local function take_off(member, disproved_only)
    local expires = redis.call('ZSCORE', KEYS[2], member)
    if expires then
        local reason = disproved_only and cjson.decode(redis.call('HGET', KEYS[1], member))['reason']
        if not disproved_only or reason == 'failed' or reason == 'expired' then
            if in_force(expires) then
                removed[#removed + 1] = member
            end
            drop(member)
        end
    end
    redis.call('ZREM', KEYS[4], member)
end

local delivered = tonumber(ARGV[i])
i = i + 1
for _ = 1, delivered do
    take_off(ARGV[i], true)
    i = i + 1
end
while i <= #ARGV do
    take_off(ARGV[i], false)
    i = i + 1
end

if added > 0 or #promoted > 0 then
    for _, address in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, 100)) do
        drop(address)
    end
    for _, address in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', ARGV[1], 'LIMIT', 0, 100)) do
        redis.call('ZREM', KEYS[4], address)
    end
end
return {promoted, removed}
