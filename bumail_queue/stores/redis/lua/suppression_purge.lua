#!lua flags=allow-oom
--[[
KEYS suppressed, expires, created, notes (then scopes, kept: a scope may be used again); ARGV now, limit.

Drops up to limit entries that expired by now, and up to limit lapsed notes; returns
{entries dropped, notes dropped}.
]]
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
for _, address in ipairs(gone) do
    redis.call('HDEL', KEYS[1], address)
    redis.call('ZREM', KEYS[2], address)
    redis.call('ZREM', KEYS[3], address)
end
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
for _, address in ipairs(lapsed) do
    redis.call('ZREM', KEYS[4], address)
end
return {#gone, #lapsed}
