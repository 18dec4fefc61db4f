-- Sliding window counter: one string per (key, policy) holding {window, current, previous}.
-- The arithmetic is src/algorithm/sliding_window_counter.rs, line for line (the shared part
-- in sliding_window_counter_math.lua): a count past the limit (a settlement's debt) is
-- carried into the next windows, N paid per window.
ALG[ALG_SLIDING_WINDOW_COUNTER] = function()
  local counter = packed('<ddd', '<dddB', 24)

  function counter.fresh()
    return { 0, 0, 0 }
  end

  local counts, weighted, earliest, clears_in = sliding_window_counter_math()

  -- With `charge`, an allowed request is also committed (what `commit` does, from the
  -- values already at hand). A cost above the capacity never fits: denied, with the state's
  -- answer to a look and retry_after its reset_after (never_fits in mod.rs).
  function counter.evaluate(s, now, p, cost, charge)
    if cost > p.capacity then
      local _, remaining, reset_after = counter.evaluate(s, now, p, 0)
      return false, remaining, reset_after, reset_after, 0
    end
    local n, w = p.limit, p.window
    local idx = idiv(now, w)
    local e = now - idx * w
    local prev, cur = counts(s[1], s[2], s[3], idx, n)
    local before = weighted(prev, cur, e, w)
    local allowed = before + cost * w <= n * w
    local weighted_after, cur_after = before, cur
    if allowed then
      weighted_after, cur_after = before + cost * w, cur + cost
      if charge then
        s[1], s[2], s[3] = idx, cur + cost, prev
      end
    end
    local remaining = idiv(max(n * w - weighted_after, 0), w)
    local reset_after = clears_in(prev, cur_after, idx, now, n, w)
    local retry_after = 0
    if not allowed then
      retry_after = earliest(prev, cur, idx, now, n, w, cost) - now
    end
    return allowed, remaining, reset_after, retry_after, 0
  end

  function counter.commit(s, now, p, cost)
    local idx = idiv(now, p.window)
    local prev, cur = counts(s[1], s[2], s[3], idx, p.limit)
    s[1], s[2], s[3] = idx, min(cur + cost, max(cur, idiv(MAX_USAGE_WINDOW_PRODUCT, p.window))), prev
  end

  -- Gives back up to `cost` units, newest first: the current window (a carried debt
  -- included), then the previous one (refund in sliding_window_counter.rs); true when the
  -- state changed.
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
    elseif s[1] < idx then
      local prev, cur = counts(s[1], s[2], s[3], idx, p.limit)
      if cur == 0 and s[1] + 1 == idx then
        local back = min(cost, s[2])
        if back == 0 then
          return false
        end
        s[2] = s[2] - back
        return true
      elseif prev > 0 or cur > 0 then
        local back = min(cost, cur)
        s[1], s[2], s[3] = idx, cur - back, max(prev - (cost - back), 0)
        return true
      end
    end
    return false
  end

  -- Charges `extra` whether or not it fits, in full (a debt past the limit), at most
  -- MAX_USAGE_WINDOW_PRODUCT / W units (overcharge in sliding_window_counter.rs); true when
  -- the state changed.
  function counter.overcharge(s, now, p, extra)
    local idx = idiv(now, p.window)
    local prev, cur = counts(s[1], s[2], s[3], idx, p.limit)
    s[1], s[2], s[3] = idx, min(cur + extra, max(cur, idiv(MAX_USAGE_WINDOW_PRODUCT, p.window))), prev
    return true
  end

  -- The end of the window after the one that pays the count off; with a per-key override,
  -- at the slower of its limit and the plan's (the override can end with no write to move
  -- the key's TTL).
  function counter.expires_at(s, p)
    return (s[1] + max(ceil_div(s[2], p.slowest or p.limit), 1) + 1) * p.window
  end

  -- No later than expires_at under any limit.
  function counter.kept_since(s, p)
    return (s[1] + 2) * p.window
  end

  return counter
end
