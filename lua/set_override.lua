-- tollgate: sets or removes a per-key override, taking the override mark off the key's state
-- (prelude.lua) when one is set; for a token bucket, also brings the bucket up to date under
-- the rate in force until now, and keeps its state key as long as the new rate needs it.
--
-- KEYS[1]: the key's state (for a bucket, {deficit in tokens x W, updated_at}, little-endian
-- doubles), KEYS[2]: its override key.
-- ARGV[1]: the override's value (limit and capacity, little-endian doubles), or "" to remove
-- the override; ARGV[2]: its TTL in ms, or "" for none; ARGV[3]: for a token bucket the
-- plan's limit (tokens refilled per window, N, the deficit shrinking by N per ms), "" for
-- the other algorithms; ARGV[4]: now in ms, or "" to read the server clock; ARGV[5]: the
-- policy's algorithm (its number in ALG), ARGV[6] and ARGV[7] the plan's limit and window
-- (ms).
--
-- A window's count past a lower override's limit is a debt paid at that limit per window
-- (as the memory store keeps it, `expires_at`): the state key's TTL, set under the plan's
-- limit, is lengthened to what the slower of the two needs. A refused request writes
-- nothing, so no later call would; without it the key would expire, forgiving the debt.
--
-- The override mark comes off in the same call that sets the override: the common call in
-- single.lua reads no override for a marked state.
--
-- The refill since the bucket's last charge is put in at the rate in force until now (the
-- override being replaced, or the plan's), as the memory store does (TokenBucket::catch_up):
-- otherwise the new rate would apply to time before it was set. The state is then written
-- with the TTL the expiry rule of prelude.lua gives it, its refill at the slower of the new
-- rate and the plan's: an override can end (its TTL, or removal) with no write to move the
-- key's TTL, and no write may come before the old TTL runs out (the bucket would start full,
-- admitting what the slower refill should hold back).
local now = ARGV[4] ~= '' and tonumber(ARGV[4])
if not now then
  local t = redis.call('TIME')
  -- Converted by the arithmetic, once each (see single.lua).
  now = t[1] * 1000 + math.floor(t[2] / 1000)
end
local plan = tonumber(ARGV[3])
local before = plan
local current = redis.pcall('GET', KEYS[2])
if type(current) == 'string' and #current == 16 then
  before = struct.unpack('<d', current)
end
local after = plan
if ARGV[1] == '' then
  redis.call('UNLINK', KEYS[2])
else
  after = struct.unpack('<d', ARGV[1])
  if ARGV[2] == '' then
    redis.call('SET', KEYS[2], ARGV[1])
  else
    redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
  end
end
local v = redis.pcall('GET', KEYS[1])
if type(v) ~= 'string' then
  return 0
end
-- A string state of whole doubles and one byte more ends with the mark.
local marked = #v % 8 == 1
if not plan or plan <= 0 or not before or before <= 0 or #v ~= 16 and #v ~= 17 then
  if marked and ARGV[1] ~= '' then
    redis.call('SET', KEYS[1], v:sub(1, #v - 1), 'KEEPTTL')
  end
  local alg, n, w = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
  -- The two window algorithms' states: {window, count} and {window, current, previous}.
  local size = ({ [ALG_FIXED_WINDOW] = 16, [ALG_SLIDING_WINDOW_COUNTER] = 24 })[alg]
  if ARGV[1] == '' or not size or not n or not w or n <= 0 or w <= 0 or #v ~= size and #v ~= size + 1 then
    return 0
  end
  -- {window, count, ...}: the window of the last charge and the units counted in it. A
  -- window ahead of the clock was counted under a shorter window: nothing of it is carried.
  local window, count = struct.unpack('<dd', v)
  if window > math.floor(now / w) then
    return 0
  end
  local slow = math.min(after, n)
  -- ceil(count / slow), at least 1 (count < 2^53).
  local windows = math.max(math.floor(count / slow), 1)
  if windows * slow < count then
    windows = windows + 1
  end
  if alg == ALG_SLIDING_WINDOW_COUNTER then
    windows = windows + 1
  end
  local t = math.max((window + windows) * w, now) + TTL_MARGIN_MS
  local target = t + (-t) % TTL_GRID_MS
  -- Past 2^52 ms (a count from a shorter window, read under this one) is forever enough,
  -- and a larger number would reach Redis in exponent form.
  local ttl = math.min(target - now, MAX_USAGE_WINDOW_PRODUCT)
  local left = redis.call('PTTL', KEYS[1])
  if left >= 0 and left < ttl then
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
  return 0
end
local deficit, updated = struct.unpack('<dd', v)
if now > updated then
  -- A product past 2^53 is inexact, but then past the deficit, which is clamped to 0.
  deficit = math.max(deficit - (now - updated) * before, 0)
  updated = now
end
-- ceil(deficit / slow), exactly (deficit < 2^53).
local slow = math.min(after, plan)
local q = math.floor(deficit / slow)
if q * slow > deficit then
  q = q - 1
elseif (q + 1) * slow <= deficit then
  q = q + 1
end
if deficit - q * slow > 0 then
  q = q + 1
end
local target = math.max(updated + q, now) + TTL_MARGIN_MS
target = target + (-target) % TTL_GRID_MS
redis.call('SET', KEYS[1], struct.pack('<dd', deficit, updated), 'PX', target - now)
return 1
