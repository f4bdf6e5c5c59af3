#!lua flags=allow-oom
--[[
KEYS index; ARGV prefix, destination, now, rate, capacity, concurrency, initial window,
reset seconds, slot, slot lease end, held, held until, seconds an idle bucket is kept,
quota in force, quota period, bin width, cost, bin of now.
Empty strings stand for none; times are seconds since the epoch, the caller's.

shaping.Bucket.take as one script: the destination's hash (tokens, tokens_at, window,
suspended_until, active_at, held, held_until, quota_period, quota_until), the sorted
set of its slots scored by lease end, and the hash of its quota's bins (bin start ->
count). Returns {granted 1 or 0, reason, retry at, slots held, limit}.
]]
local bucket = ARGV[1] .. 'shaping:' .. ARGV[2]
local slots = bucket .. ':slots'
local bins = bucket .. ':quota'
local now = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', slots, '-inf', now)
local live = redis.call('ZCARD', slots)
local f = redis.call('HMGET', bucket, 'tokens', 'tokens_at', 'window', 'suspended_until', 'active_at', 'held', 'held_until', 'quota_until')
local tokens, tokens_at, window = tonumber(f[1]), tonumber(f[2]) or 0, tonumber(f[3])
local suspended_until, active_at = tonumber(f[4]) or 0, tonumber(f[5]) or 0
local held, held_until = tonumber(f[6]) or 0, tonumber(f[7]) or 0
local quota_until = tonumber(f[8]) or 0

-- The quota's bins still within its window (the rest dropped), oldest first, and their sum.
local quota, period, width, cost = tonumber(ARGV[14]), tonumber(ARGV[15]), tonumber(ARGV[16]), tonumber(ARGV[17])
local kept, used = {}, 0
if quota ~= nil then
    local all = redis.call('HGETALL', bins)
    for i = 1, #all, 2 do
        local start, count = tonumber(all[i]), tonumber(all[i + 1])
        if start + width > now - period then
            kept[#kept + 1] = {start, count}
            used = used + count
        else
            redis.call('HDEL', bins, all[i])
        end
    end
    table.sort(kept, function(a, b) return a[1] < b[1] end)
end
local function fits(counted) return counted + cost <= quota or counted <= 0 end

local report = tonumber(ARGV[11]) or 0
if report > 0 then
    if held_until > now then held = held + report else held = report end
    held_until = math.max(held_until, tonumber(ARGV[12]) or now)
end

local initial = tonumber(ARGV[7])
if initial == nil then
    window = nil
elseif window == nil or (live == 0 and now - active_at > tonumber(ARGV[8])) then
    window = initial
end
local concurrency = tonumber(ARGV[6])
local limit = nil
if concurrency ~= nil then
    if window == nil then limit = concurrency else limit = math.max(1, math.min(concurrency, math.floor(window))) end
end
local rate, capacity = tonumber(ARGV[4]), tonumber(ARGV[5])
local refill = nil
if rate ~= nil then
    if tokens == nil then refill = capacity else refill = math.min(capacity, tokens + math.max(0, now - tokens_at) * rate) end
end

local reason, retry = '', ''
if suspended_until > now then
    reason, retry = 'suspended', string.format('%.6f', suspended_until)
elseif quota ~= nil and not fits(used) then
    -- Room comes when enough of the oldest bins have left the window.
    local left, room = used, now
    for _, bin in ipairs(kept) do
        left = left - bin[2]
        if fits(left) then room = bin[1] + width + period break end
    end
    reason, retry = 'quota', string.format('%.6f', room)
elseif refill ~= nil and refill < 1 then
    reason, retry = 'rate', string.format('%.6f', now + (1 - refill) / rate)
elseif limit ~= nil and live >= limit then
    reason = 'concurrency'
end
local granted = reason == ''

if refill ~= nil then
    if granted then refill = refill - 1 end
    redis.call('HSET', bucket, 'tokens', string.format('%.9f', refill), 'tokens_at', string.format('%.6f', math.max(now, tokens_at)))
else
    redis.call('HDEL', bucket, 'tokens')
end
if window ~= nil then redis.call('HSET', bucket, 'window', window) else redis.call('HDEL', bucket, 'window') end
if granted then
    active_at = now
    if ARGV[9] ~= '' then
        redis.call('ZADD', slots, ARGV[10], ARGV[9])
        live = live + 1
    end
    if quota ~= nil then
        redis.call('HINCRBYFLOAT', bins, ARGV[18], cost)
        quota_until = math.max(quota_until, tonumber(ARGV[18]) + width + period)
        redis.call('HSET', bucket, 'quota_until', string.format('%.6f', quota_until))
    end
end
if quota ~= nil then redis.call('HSET', bucket, 'quota_period', period) end
redis.call('HSET', bucket, 'active_at', string.format('%.6f', active_at), 'held', held, 'held_until', string.format('%.6f', held_until))

-- Kept while anything is pending, then an hour (ARGV[13]) more; times relative to the caller's now.
local last = math.max(now, suspended_until, held_until, quota_until)
local newest = redis.call('ZRANGE', slots, -1, -1, 'WITHSCORES')
if newest[2] then last = math.max(last, tonumber(newest[2])) end
local keep = math.ceil(last - now + tonumber(ARGV[13]))
redis.call('EXPIRE', bucket, keep)
redis.call('EXPIRE', slots, keep)
redis.call('EXPIRE', bins, keep)
redis.call('ZADD', KEYS[1], last + tonumber(ARGV[13]), ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. now)

local shown_limit = ''
if limit ~= nil then shown_limit = limit end
return {granted and 1 or 0, reason, retry, live, shown_limit}
