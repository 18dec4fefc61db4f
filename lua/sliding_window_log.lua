-- Sliding window log: one sorted set per (key, policy). Score = ms, member = "<ms>:<cost>".
-- Requests in the same millisecond are merged into one member (its cost summed), exactly as
-- the memory store merges them, so two requests in one millisecond never collide.
-- The arithmetic is src/algorithm/sliding_window_log.rs.
local log = {}

-- The live entries (logged after now - W), oldest first.
function log.load(key, now, p)
  local members = redis.call('ZRANGEBYSCORE', key, '(' .. int(now - p.window), '+inf')
  local ts, cs = {}, {}
  for i, m in ipairs(members) do
    local sep = string.find(m, ':', 1, true)
    ts[i] = tonumber(string.sub(m, 1, sep - 1))
    cs[i] = tonumber(string.sub(m, sep + 1))
  end
  return { ts = ts, cs = cs }
end

function log.evaluate(s, now, p, cost)
  local n, w = p.limit, p.window
  local ts, cs = s.ts, s.cs
  local used = 0
  for i = 1, #cs do
    used = used + cs[i]
  end
  local allowed = used + cost <= n
  local after, reset_after = used, 0
  if allowed and cost > 0 then
    after, reset_after = used + cost, w
  elseif #ts > 0 then
    reset_after = ts[#ts] + w - now
  end
  local retry_after = 0
  if not allowed then
    local freed, at = 0, now
    for i = 1, #ts do
      freed = freed + cs[i]
      at = ts[i] + w
      if used - freed + cost <= n then
        break
      end
    end
    retry_after = at - now
  end
  return allowed, math.max(n - after, 0), reset_after, retry_after, 0
end

function log.commit(key, s, now, p, cost)
  local w = p.window
  redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now - w))
  local ts, cs = s.ts, s.cs
  local total = cost
  for i = #ts, 1, -1 do
    if ts[i] == now then
      total = total + cs[i]
      redis.call('ZREM', key, int(now) .. ':' .. int(cs[i]))
      break
    end
  end
  redis.call('ZADD', key, int(now), int(now) .. ':' .. int(total))
  expire_at(key, math.max(ts[#ts] or now, now) + w, now)
end

ALG[2] = log
