-- Sliding window counter: one hash per (key, policy) with fields window/current/previous.
-- The arithmetic is src/algorithm/sliding_window_counter.rs, line for line.
local counter = {}

function counter.load(key)
  local v = redis.call('HMGET', key, 'window', 'current', 'previous')
  return { window = tonumber(v[1]) or 0, current = tonumber(v[2]) or 0, previous = tonumber(v[3]) or 0 }
end

local function counter_counts(s, idx)
  if s.window == idx then
    return s.previous, s.current
  elseif s.window + 1 == idx then
    return s.current, 0
  end
  return 0, 0
end

local function counter_earliest(prev, cur, idx, now, n, w, cost)
  local start = idx * w
  if cur + cost <= n then
    local budget = (n - cur - cost) * w
    if prev == 0 then
      return now
    end
    local overlap = idiv(budget, prev)
    if overlap >= 1 then
      return math.max(start + w - math.min(overlap, w), now)
    end
  end
  local next_start = start + w
  if cur == 0 then
    return next_start
  end
  local overlap = idiv((n - cost) * w, cur)
  if overlap >= 1 then
    return next_start + w - math.min(overlap, w)
  end
  return next_start + w
end

function counter.evaluate(s, now, p, cost)
  local n, w = p.limit, p.window
  local idx = idiv(now, w)
  local e = now - idx * w
  local prev, cur = counter_counts(s, idx)
  local weighted = prev * (w - e) + cur * w
  local allowed = weighted + cost * w <= n * w
  local weighted_after, cur_after = weighted, cur
  if allowed then
    weighted_after, cur_after = weighted + cost * w, cur + cost
  end
  local remaining = idiv(math.max(n * w - weighted_after, 0), w)
  local reset_after = 0
  if cur_after > 0 then
    reset_after = (idx + 2) * w - now
  elseif prev > 0 then
    reset_after = (idx + 1) * w - now
  end
  local retry_after = 0
  if not allowed then
    retry_after = counter_earliest(prev, cur, idx, now, n, w, cost) - now
  end
  return allowed, remaining, reset_after, retry_after, 0
end

function counter.commit(key, s, now, p, cost)
  local w = p.window
  local idx = idiv(now, w)
  local prev, cur = counter_counts(s, idx)
  redis.call('HSET', key, 'window', int(idx), 'current', int(cur + cost), 'previous', int(prev))
  expire_at(key, (idx + 2) * w, now)
end

ALG[1] = counter
