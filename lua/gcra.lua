-- GCRA: one hash per (key, policy) with fields tat/frac (the theoretical arrival time in whole
-- ms plus a remainder in 1/N ms). The arithmetic is src/algorithm/gcra.rs, shaping included.
local gcra = {}

function gcra.load(key)
  local v = redis.call('HMGET', key, 'tat', 'frac')
  return { tat = tonumber(v[1]) or 0, frac = tonumber(v[2]) or 0 }
end

local function gcra_backlog(s, now, n)
  if s.tat >= now then
    return (s.tat - now) * n + s.frac
  end
  return 0
end

function gcra.evaluate(s, now, p, cost)
  local n, w = p.limit, p.window
  local tolerance = p.capacity * w
  local slack = p.max_delay * n
  local backlog = gcra_backlog(s, now, n)
  local after = backlog + cost * w
  local allowed = after <= tolerance + slack
  if allowed then
    local delay = ceil_div(math.max(after - tolerance, 0), n)
    return true, idiv(math.max(tolerance - after, 0), w), ceil_div(after, n), 0, delay
  end
  local retry_after = ceil_div(after - tolerance - slack, n)
  return false, idiv(math.max(tolerance - backlog, 0), w), ceil_div(backlog, n), retry_after, 0
end

function gcra.commit(key, s, now, p, cost)
  local n = p.limit
  local after = gcra_backlog(s, now, n) + cost * p.window
  local whole = idiv(after, n)
  local frac = after - whole * n
  redis.call('HSET', key, 'tat', int(now + whole), 'frac', int(frac))
  local expires_at = now + whole
  if frac > 0 then
    expires_at = expires_at + 1
  end
  expire_at(key, expires_at, now)
end

ALG[5] = gcra
