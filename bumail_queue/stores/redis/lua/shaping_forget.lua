#!lua flags=allow-oom
--[[
KEYS index; ARGV prefix, before, now.

Drops the buckets no session used since before and that hold nothing back at now, nor
a quota's count still within its window (the time to live drops them anyway, an hour
after; this is for the operators' purge).
Returns how many.
]]
local before, now = tonumber(ARGV[2]), tonumber(ARGV[3])
local dropped = 0
for _, destination in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
    local bucket = ARGV[1] .. 'shaping:' .. destination
    local f = redis.call('HMGET', bucket, 'active_at', 'suspended_until', 'held_until', 'quota_until')
    if (tonumber(f[1]) or 0) < before and (tonumber(f[2]) or 0) <= now and (tonumber(f[3]) or 0) <= now
        and (tonumber(f[4]) or 0) <= now then
        redis.call('DEL', bucket, bucket .. ':slots', bucket .. ':quota')
        redis.call('ZREM', KEYS[1], destination)
        dropped = dropped + 1
    end
end
return dropped
