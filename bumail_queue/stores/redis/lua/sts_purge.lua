#!lua flags=allow-oom
--[[
KEYS policies, expires, failures, failures until; ARGV now.

Drops the MTA-STS policies that expired by now and the fetch failures that lapsed by
now, each found by its sorted set; returns how many went in all.
]]
local gone = 0
for _, pair in ipairs({{KEYS[1], KEYS[2]}, {KEYS[3], KEYS[4]}}) do
    local domains = redis.call('ZRANGEBYSCORE', pair[2], '-inf', ARGV[1])
    for _, domain in ipairs(domains) do
        redis.call('HDEL', pair[1], domain)
    end
    redis.call('ZREMRANGEBYSCORE', pair[2], '-inf', ARGV[1])
    gone = gone + #domains
end
return gone
