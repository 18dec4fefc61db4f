-- Sliding window counter: one string per (key, policy) holding {window, current, previous}.
-- The arithmetic is src/algorithm/sliding_window_counter.rs, line for line.
ALG[1] = function()
  local counter = packed('<ddd', 24)

  function counter.fresh()
    return { 0, 0, 0 }
  end

  local function counter_counts(s, idx)
    if s[1] == idx then
      return s[3], s[2]
    elseif s[1] + 1 == idx then
      return s[2], 0
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
        return max(start + w - min(overlap, w), now)
      end
    end
    local next_start = start + w
    if cur == 0 then
      return next_start
    end
    local overlap = idiv((n - cost) * w, cur)
    if overlap >= 1 then
      return next_start + w - min(overlap, w)
    end
    return next_start + w
  end

  -- With `charge`, an allowed request is also committed (what `commit` does, from the
  -- values already at hand).
  function counter.evaluate(s, now, p, cost, charge)
    local n, w = p.limit, p.window
    local idx = idiv(now, w)
    local e = now - idx * w
    local prev, cur = counter_counts(s, idx)
    local weighted = prev * (w - e) + cur * w
    local allowed = weighted + cost * w <= n * w
    local weighted_after, cur_after = weighted, cur
    if allowed then
      weighted_after, cur_after = weighted + cost * w, cur + cost
      if charge then
        s[1], s[2], s[3] = idx, cur + cost, prev
      end
    end
    local remaining = idiv(max(n * w - weighted_after, 0), w)
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

  function counter.commit(s, now, p, cost)
    local idx = idiv(now, p.window)
    local prev, cur = counter_counts(s, idx)
    s[1], s[2], s[3] = idx, cur + cost, prev
  end

  -- Gives back up to `cost` units, newest first: the current window, then the previous one
  -- (refund in sliding_window_counter.rs); true when the state changed.
  function counter.refund(s, now, p, cost)
    local idx = idiv(now, p.window)
    if s[1] == idx then
      local back = min(cost, s[2])
      local rest = min(cost - back, s[3])
      if back + rest == 0 then
        return false
      end
      s[2], s[3] = s[2] - back, s[3] - rest
      return true
    elseif s[1] + 1 == idx then
      local back = min(cost, s[2])
      if back == 0 then
        return false
      end
      s[2] = s[2] - back
      return true
    end
    return false
  end

  -- Charges `extra` whether or not it fits, never beyond the limit in the current window
  -- (overcharge in sliding_window_counter.rs); true when the state changed.
  function counter.overcharge(s, now, p, extra)
    local idx = idiv(now, p.window)
    local prev, cur = counter_counts(s, idx)
    s[1], s[2], s[3] = idx, min(cur + extra, max(cur, p.limit)), prev
    return true
  end

  function counter.expires_at(s, p)
    return (s[1] + 2) * p.window
  end

  return counter
end
