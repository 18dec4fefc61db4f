-- Token bucket: one hash per (key, policy) with fields deficit/updated_at; the deficit is
-- missing tokens x W, refilled by N per ms. The arithmetic is src/algorithm/token_bucket.rs.
local bucket = {}

function bucket.load(key)
  local v = redis.call('HMGET', key, 'deficit', 'updated_at')
  return { deficit = tonumber(v[1]) or 0, updated_at = tonumber(v[2]) or 0 }
end

local function bucket_deficit(s, now, n)
  local elapsed = math.max(now - s.updated_at, 0)
  return math.max(s.deficit - elapsed * n, 0)
end

function bucket.evaluate(s, now, p, cost)
  local n, w = p.limit, p.window
  local full = p.capacity * w
  local deficit = bucket_deficit(s, now, n)
  local allowed = deficit + cost * w <= full
  local after = deficit
  local retry_after = 0
  if allowed then
    after = deficit + cost * w
  else
    retry_after = ceil_div(deficit + cost * w - full, n)
  end
  return allowed, idiv(full - after, w), ceil_div(after, n), retry_after, 0
end

function bucket.commit(key, s, now, p, cost)
  local n = p.limit
  local deficit = bucket_deficit(s, now, n) + cost * p.window
  local updated_at = math.max(now, s.updated_at)
  redis.call('HSET', key, 'deficit', int(deficit), 'updated_at', int(updated_at))
  expire_at(key, updated_at + ceil_div(deficit, n), now)
end

ALG[3] = bucket
