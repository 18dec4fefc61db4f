-- tollgate: sets a per-key override of a token bucket policy, and keeps the bucket's state
-- key at least as long as the override's refill rate needs it.
--
-- KEYS[1]: the bucket's state ({deficit in tokens x W, updated_at}, little-endian doubles),
-- KEYS[2]: its override key.
-- ARGV[1]: the override's value (limit and capacity, little-endian doubles); ARGV[2]: its TTL
-- in ms, or "" for none; ARGV[3]: the override's limit (tokens refilled per window, N, the
-- deficit shrinking by N per ms); ARGV[4]: now in ms, or "" to read the server clock.
--
-- A state's key expires on a grid after its deficit would be refilled at the rate it was
-- last written under (see TTL_MARGIN_MS). An override that lowers the rate makes the same
-- deficit matter longer, and no write may come to move the key's TTL before it runs out:
-- the bucket would then start full, admitting what the slower refill should hold back. So
-- the TTL is extended here, never shortened, to where the override's rate puts it.
if ARGV[2] == '' then
  redis.call('SET', KEYS[2], ARGV[1])
else
  redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
end
local v = redis.pcall('GET', KEYS[1])
if type(v) ~= 'string' or #v ~= 16 then
  return 0
end
local deficit, updated = struct.unpack('<dd', v)
local n = tonumber(ARGV[3])
if deficit <= 0 or not n or n <= 0 then
  return 0
end
local now = tonumber(ARGV[4])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local TTL_MARGIN_MS = 1000
local TTL_GRID_MS = 512
local target = math.max(updated + math.ceil(deficit / n), now) + TTL_MARGIN_MS
target = target + (-target) % TTL_GRID_MS
local pttl = redis.call('PTTL', KEYS[1])
if pttl >= 0 and now + pttl < target then
  redis.call('PEXPIRE', KEYS[1], target - now)
  return 1
end
return 0
