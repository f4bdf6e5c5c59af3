#!lua
--[[
KEYS suppressed, expires, created, notes; ARGV now, note-until ('' for no note), the
count of entries to add then four each (address, entry, created, expires), the count
of expiries then four each as well, then the addresses to take off.

The suppression list in one step. An entry is added, or replaces the address's own.
An expiry of an address whose entry is in force changes nothing; with a note still
lasting it adds its entry; otherwise it is noted until note-until. An address taken
off loses its entry and its note. Adding drops up to 100 entries and notes that
expired on the way. Returns {addresses an expiry added, addresses taken off whose
entries were in force}.
]]
local now = tonumber(ARGV[1])
local note_until = ARGV[2]

local function put(address, entry, created, expires)
    redis.call('HSET', KEYS[1], address, entry)
    redis.call('ZADD', KEYS[2], expires, address)
    redis.call('ZADD', KEYS[3], created, address)
    redis.call('ZREM', KEYS[4], address)
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
while i <= #ARGV do
    local address = ARGV[i]
    local expires = redis.call('ZSCORE', KEYS[2], address)
    if expires then
        if in_force(expires) then
            removed[#removed + 1] = address
        end
        drop(address)
    end
    redis.call('ZREM', KEYS[4], address)
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
