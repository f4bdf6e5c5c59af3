#!lua
--[[
KEYS items, seq, keys; ARGV prefix, max ('' for no limit), wake channel, held (the
score of HELD_AT), then ten per item: id, key ('' for none, else '=' and the key),
from, recipients, size, created, next, priority, channel, message.

An item added held (next at or past held) goes in no lane's ready set, as hold.lua
leaves one: no claim meets it until release.lua puts it there.

All or nothing: every item is looked at before anything is written. Returns
{'full', count} when the new items would take the queue beyond max; otherwise
{'ok', entries}, an entry per item in order: 'ok' when it was added, the fields of
the item already holding its key (or its id: the same add sent again after a lost
reply), or the 1-based position of an earlier item of this call with the same key.
]]
local prefix, max, channel, held = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local FIELDS = 10
local count = (#ARGV - 4) / FIELDS
local entries, fresh, batch_keys = {}, {}, {}

for i = 1, count do
    local base = 4 + (i - 1) * FIELDS
    local id, key = ARGV[base + 1], ARGV[base + 2]
    local entry = 'ok'
    if redis.call('EXISTS', prefix .. 'item:' .. id) == 1 then
        entry = redis.call('HGETALL', prefix .. 'item:' .. id)
    elseif key ~= '' then
        key = string.sub(key, 2)
        local holder = redis.call('HGET', KEYS[3], key)
        if batch_keys[key] then
            entry = batch_keys[key]
        elseif holder and redis.call('EXISTS', prefix .. 'item:' .. holder) == 1 then
            entry = redis.call('HGETALL', prefix .. 'item:' .. holder)
        else
            -- A holder whose hash is gone left its key behind: the key is free.
            batch_keys[key] = i
        end
    end
    entries[i] = entry
    if entry == 'ok' then
        fresh[#fresh + 1] = base
    end
end

if max ~= '' then
    local queued = redis.call('ZCARD', KEYS[1])
    if queued + #fresh > tonumber(max) then
        return {'full', queued}
    end
end

for _, base in ipairs(fresh) do
    local id, key, next = ARGV[base + 1], ARGV[base + 2], ARGV[base + 7]
    local priority, lane_channel = ARGV[base + 8], ARGV[base + 9]
    -- Sixteen digits, so that members equally due sort by age (Redis compares bytes).
    local member = string.format('%016.0f', redis.call('INCR', KEYS[2])) .. ':' .. id
    local item = prefix .. 'item:' .. id
    redis.call('HSET', item, 'id', id, 'from', ARGV[base + 3], 'recipients', ARGV[base + 4],
        'size', ARGV[base + 5], 'created', ARGV[base + 6], 'next', next,
        'attempts', '0', 'delay', '0', 'member', member, 'rev', '0',
        'priority', priority, 'channel', lane_channel)
    if key ~= '' then
        redis.call('HSET', item, 'key', string.sub(key, 2))
        redis.call('HSET', KEYS[3], string.sub(key, 2), id)
    end
    -- In the same script as the item: no claim can see the one without the other.
    redis.call('SET', prefix .. 'message:' .. id, ARGV[base + 10])
    redis.call('ZADD', KEYS[1], next, member)
    if tonumber(next) < held then
        make_ready(prefix, lane_of(priority, lane_channel), next, member)
    end
end
if #fresh > 0 then
    redis.call('PUBLISH', channel, '')
end
return {'ok', entries}
