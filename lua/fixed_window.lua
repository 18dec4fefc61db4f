-- Fixed window: one hash per (key, policy) with fields window/count.
-- The arithmetic is src/algorithm/fixed_window.rs.
local fixed = {}

function fixed.load(key)
  local v = redis.call('HMGET', key, 'window', 'count')
  return { window = tonumber(v[1]) or 0, count = tonumber(v[2]) or 0 }
end

local function fixed_count(s, idx)
  if s.window == idx then
    return s.count
  end
  return 0
end

function fixed.evaluate(s, now, p, cost)
  local n, w = p.limit, p.window
  local idx = idiv(now, w)
  local count = fixed_count(s, idx)
  local window_end = (idx + 1) * w - now
  local allowed = count + cost <= n
  local after = count
  if allowed then
    after = count + cost
  end
  local reset_after = 0
  if after > 0 then
    reset_after = window_end
  end
  return allowed, math.max(n - after, 0), reset_after, window_end, 0
end

function fixed.commit(key, s, now, p, cost)
  local w = p.window
  local idx = idiv(now, w)
  redis.call('HSET', key, 'window', int(idx), 'count', int(fixed_count(s, idx) + cost))
  expire_at(key, (idx + 1) * w, now)
end

ALG[4] = fixed
