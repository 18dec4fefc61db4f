-- Fixed window: one string per (key, policy) holding {window, count}.
-- The arithmetic is src/algorithm/fixed_window.rs: a count past the limit (a settlement's
-- debt) is carried into the next windows, N paid per window.
ALG[ALG_FIXED_WINDOW] = function()
  local fixed = packed('<dd', '<ddB', 16)

  function fixed.fresh()
    return { 0, 0 }
  end

  -- The units counted in window idx (count_at in fixed_window.rs). A product past 2^53 is
  -- inexact, but then above the count, and the difference is clamped to 0.
  local function fixed_count(s, idx, n)
    if s[1] == idx then
      return s[2]
    elseif s[1] < idx then
      return max(s[2] - n * (idx - s[1]), 0)
    end
    return 0
  end

  -- Time until a count is paid off (clears_in in fixed_window.rs).
  local function fixed_clears_in(count, n, w, window_end)
    if count == 0 then
      return 0
    end
    return window_end + (ceil_div(count, n) - 1) * w
  end

  -- With `charge`, an allowed request is also committed (what `commit` does). A cost above
  -- the capacity never fits (never_fits in mod.rs).
  function fixed.evaluate(s, now, p, cost, charge)
    if cost > p.capacity then
      local _, remaining, reset_after = fixed.evaluate(s, now, p, 0)
      return false, remaining, reset_after, reset_after, 0
    end
    local n, w = p.limit, p.window
    local idx = idiv(now, w)
    local count = fixed_count(s, idx, n)
    local window_end = (idx + 1) * w - now
    local allowed = count + cost <= n
    local after = count
    local retry_after = 0
    if allowed then
      after = count + cost
      if charge then
        s[1], s[2] = idx, after
      end
    else
      retry_after = window_end + (ceil_div(count + cost - n, n) - 1) * w
    end
    return allowed, max(n - after, 0), fixed_clears_in(after, n, w, window_end), retry_after, 0
  end

  function fixed.commit(s, now, p, cost)
    local idx = idiv(now, p.window)
    local count = fixed_count(s, idx, p.limit)
    s[1], s[2] = idx, min(count + cost, max(count, idiv(MAX_USAGE_WINDOW_PRODUCT, p.window)))
  end

  -- Gives back up to `cost` units still counted in the current window, a carried debt
  -- included (refund in fixed_window.rs); true when the state changed.
  function fixed.refund(s, now, p, cost)
    local idx = idiv(now, p.window)
    local count = fixed_count(s, idx, p.limit)
    if count == 0 or cost == 0 then
      return false
    end
    s[1], s[2] = idx, count - min(cost, count)
    return true
  end

  -- Charges `extra` whether or not it fits, in full (a debt past the limit), at most
  -- MAX_USAGE_WINDOW_PRODUCT / W units (overcharge in fixed_window.rs); true when the state
  -- changed.
  function fixed.overcharge(s, now, p, extra)
    local idx = idiv(now, p.window)
    local count = fixed_count(s, idx, p.limit)
    s[1], s[2] = idx, min(count + extra, max(count, idiv(MAX_USAGE_WINDOW_PRODUCT, p.window)))
    return true
  end

  -- The end of the window that pays the count off; with a per-key override, at the slower
  -- of its limit and the plan's (the override can end with no write to move the key's TTL).
  function fixed.expires_at(s, p)
    return (s[1] + max(ceil_div(s[2], p.slowest or p.limit), 1)) * p.window
  end

  -- No later than expires_at under any limit.
  function fixed.kept_since(s, p)
    return (s[1] + 1) * p.window
  end

  return fixed
end
