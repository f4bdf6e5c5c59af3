#!lua flags=allow-oom
--[[
KEYS index; ARGV prefix, destination, slot, now, lease end, seconds an idle bucket is kept.

1 when the slot is held at now, its lease now ending at lease end; else 0 (its session
ended, or its lease did and another may hold its place).
]]
local bucket = ARGV[1] .. 'shaping:' .. ARGV[2]
local slots = bucket .. ':slots'
local now, until_ = tonumber(ARGV[4]), tonumber(ARGV[5])
local held = redis.call('ZSCORE', slots, ARGV[3])
if not held or tonumber(held) <= now then
    return 0
end
redis.call('ZADD', slots, until_, ARGV[3])
local keep = math.ceil(until_ - now + tonumber(ARGV[6]))
if redis.call('TTL', slots) < keep then
    redis.call('EXPIRE', slots, keep)
    redis.call('EXPIRE', bucket, keep)
    redis.call('ZADD', KEYS[1], until_ + tonumber(ARGV[6]), ARGV[2])
end
return 1
