#!lua flags=allow-oom
--[[
KEYS index; ARGV prefix, destination, slot, now, window change (keep, grow, halve),
concurrency, suspend until, seconds an idle bucket is kept. Empty strings stand for none.

shaping.Bucket.release as one script: the slot let go of, the slow-start window grown
by one (up to concurrency) or halved (at least one), the suspension set unless a later
one is. Returns 1.
]]
local bucket = ARGV[1] .. 'shaping:' .. ARGV[2]
local slots = bucket .. ':slots'
local now = tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', slots, '-inf', now)
if ARGV[3] ~= '' then redis.call('ZREM', slots, ARGV[3]) end
local f = redis.call('HMGET', bucket, 'window', 'suspended_until', 'active_at', 'held_until', 'quota_until')
local window, suspended_until = tonumber(f[1]), tonumber(f[2]) or 0
local active_at, held_until = tonumber(f[3]) or 0, tonumber(f[4]) or 0
local quota_until = tonumber(f[5]) or 0
local concurrency = tonumber(ARGV[6])
if window ~= nil then
    if ARGV[5] == 'grow' then
        window = window + 1
        if concurrency ~= nil then window = math.min(concurrency, window) end
    elseif ARGV[5] == 'halve' then
        window = math.max(1, window / 2)
    end
    redis.call('HSET', bucket, 'window', window)
end
local suspend = tonumber(ARGV[7])
if suspend ~= nil then suspended_until = math.max(suspended_until, suspend) end
redis.call('HSET', bucket, 'suspended_until', string.format('%.6f', suspended_until),
    'active_at', string.format('%.6f', math.max(active_at, now)))

local last = math.max(now, suspended_until, held_until, quota_until)
local newest = redis.call('ZRANGE', slots, -1, -1, 'WITHSCORES')
if newest[2] then last = math.max(last, tonumber(newest[2])) end
local keep = math.ceil(last - now + tonumber(ARGV[8]))
redis.call('EXPIRE', bucket, keep)
redis.call('EXPIRE', slots, keep)
redis.call('EXPIRE', bucket .. ':quota', keep)
redis.call('ZADD', KEYS[1], last + tonumber(ARGV[8]), ARGV[2])
return 1
