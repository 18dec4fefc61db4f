-- Sliding window log: one sorted set per (key, policy). Score = ms, member = "<ms>:<cost>".
-- Requests in the same millisecond are merged into one member (its cost summed), exactly as
-- the memory store merges them, so two requests in one millisecond never collide.
-- The arithmetic is src/algorithm/sliding_window_log.rs. A settlement's debt (units past the
-- limit) is one member dated ahead of now, kept until the windows it used up have passed.
--
-- A batch reads the live entries once, decides every request against them in memory, and
-- writes once at the end: the trim, the member of this millisecond, and the TTL.
ALG[ALG_SLIDING_WINDOW_LOG] = function()
  local log = { zset = true }

  -- The live entries (logged after now - W), oldest first; nil and a message when the key
  -- holds something else.
  function log.load(key, now, p)
    local members = redis.pcall('ZRANGEBYSCORE', key, '(' .. int(now - p.window), '+inf')
    if members.err then
      return nil, members.err
    end
    local ts, cs = {}, {}
    for i, m in ipairs(members) do
      local sep = string.find(m, ':', 1, true)
      local t = sep and tonumber(string.sub(m, 1, sep - 1))
      local c = sep and tonumber(string.sub(m, sep + 1))
      if not (t and c) then
        return nil, 'unreadable log entry ' .. m
      end
      ts[i], cs[i] = t, c
    end
    -- What Redis holds for this millisecond, to be replaced when it changes.
    local stored
    for i = #ts, 1, -1 do
      if ts[i] == now then
        stored = cs[i]
        break
      end
    end
    return { ts = ts, cs = cs, stored = stored }
  end

  -- With `charge`, an allowed request is also committed (see `commit`). A cost above the
  -- capacity never fits (never_fits in mod.rs).
  function log.evaluate(s, now, p, cost, charge)
    if cost > p.capacity then
      local _, remaining, reset_after = log.evaluate(s, now, p, 0)
      return false, remaining, reset_after, reset_after, 0
    end
    local n, w = p.limit, p.window
    local ts, cs = s.ts, s.cs
    local used = 0
    for i = 1, #cs do
      used = used + cs[i]
    end
    local allowed = used + cost <= n
    -- When the newest entry leaves (a debt's entry is dated ahead of now).
    local newest = 0
    if #ts > 0 then
      newest = max(ts[#ts] + w - now, 0)
    end
    local after, reset_after = used, newest
    if allowed and cost > 0 then
      after, reset_after = used + cost, max(newest, w)
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
    if allowed and charge then
      log.commit(s, now, p, cost)
    end
    return allowed, max(n - after, 0), reset_after, retry_after, 0
  end

  -- Logs `cost` at `at`, in time order (log_at in sliding_window_log.rs); the cost logged at
  -- `at` before, or nil.
  local function log_at(s, at, cost)
    local ts, cs = s.ts, s.cs
    for i = #ts, 1, -1 do
      if ts[i] == at then
        local was = cs[i]
        cs[i] = cs[i] + cost
        return was
      elseif ts[i] < at then
        table.insert(ts, i + 1, at)
        table.insert(cs, i + 1, cost)
        return nil
      end
    end
    table.insert(ts, 1, at)
    table.insert(cs, 1, cost)
    return nil
  end

  function log.commit(s, now, p, cost)
    log_at(s, now, cost)
  end

  -- Takes up to `cost` units off the newest entries, removing emptied ones (refund in
  -- sliding_window_log.rs); true when the state changed. Every entry of another millisecond
  -- it changes is noted in `s.refunded` (time -> cost as loaded) for `store` to rewrite; the
  -- entry of this millisecond is rewritten anyway.
  function log.refund(s, now, p, cost)
    local ts, cs = s.ts, s.cs
    local left, changed = cost, false
    while left > 0 and #ts > 0 do
      local k = #ts
      local t = ts[k]
      if t ~= now then
        s.refunded = s.refunded or {}
        if s.refunded[t] == nil then
          s.refunded[t] = cs[k]
        end
      end
      local take = min(left, cs[k])
      cs[k], left, changed = cs[k] - take, left - take, true
      if cs[k] == 0 then
        ts[k], cs[k] = nil, nil
      end
    end
    return changed
  end

  -- Logs `extra` units whether or not they fit, in full: at now while the window's units
  -- stay within the limit, else as one entry dated ceil(total / N) - 1 windows ahead; at
  -- most MAX_USAGE_WINDOW_PRODUCT / W units (overcharge in sliding_window_log.rs). An entry
  -- of another millisecond is noted in `s.refunded` (time -> cost as loaded, 0 for a new
  -- one) for `store` to rewrite. True when the state changed.
  function log.overcharge(s, now, p, extra)
    local n, w = p.limit, p.window
    local used = 0
    for i = 1, #s.cs do
      used = used + s.cs[i]
    end
    local total = min(used + extra, max(used, idiv(MAX_USAGE_WINDOW_PRODUCT, w)))
    extra = total - used
    if extra == 0 then
      return false
    end
    local at = now + (ceil_div(total, n) - 1) * w
    local was = log_at(s, at, extra)
    if at ~= now then
      s.refunded = s.refunded or {}
      if s.refunded[at] == nil then
        s.refunded[at] = was or 0
      end
    end
    return true
  end

  function log.store(key, s, now, p)
    local w = p.window
    local ts, cs = s.ts, s.cs
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now - w)
    if s.stored then
      redis.call('ZREM', key, int(now) .. ':' .. int(s.stored))
    end
    local refunded = s.refunded
    if refunded then
      for t, c in pairs(refunded) do
        redis.call('ZREM', key, int(t) .. ':' .. int(c))
      end
      for i = 1, #ts do
        if refunded[ts[i]] then
          redis.call('ZADD', key, ts[i], int(ts[i]) .. ':' .. int(cs[i]))
        end
      end
    end
    for i = #ts, 1, -1 do
      if ts[i] == now then
        redis.call('ZADD', key, now, int(now) .. ':' .. int(cs[i]))
        break
      end
    end
    if #ts > 0 then
      redis.call('PEXPIRE', key, ttl(max(ts[#ts], now) + w, now))
    end
  end

  return log
end
