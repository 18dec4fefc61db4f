-- Fixed window: one string per (key, policy) holding {window, count}.
-- The arithmetic is src/algorithm/fixed_window.rs.
ALG[4] = function()
  local fixed = packed('<dd', 16)

  function fixed.fresh()
    return { 0, 0 }
  end

  local function fixed_count(s, idx)
    if s[1] == idx then
      return s[2]
    end
    return 0
  end

  -- With `charge`, an allowed request is also committed (what `commit` does).
  function fixed.evaluate(s, now, p, cost, charge)
    local n, w = p.limit, p.window
    local idx = idiv(now, w)
    local count = fixed_count(s, idx)
    local window_end = (idx + 1) * w - now
    local allowed = count + cost <= n
    local after = count
    if allowed then
      after = count + cost
      if charge then
        s[1], s[2] = idx, after
      end
    end
    local reset_after = 0
    if after > 0 then
      reset_after = window_end
    end
    return allowed, max(n - after, 0), reset_after, window_end, 0
  end

  function fixed.commit(s, now, p, cost)
    local idx = idiv(now, p.window)
    s[2] = fixed_count(s, idx) + cost
    s[1] = idx
  end

  -- Gives back up to `cost` units of the current window (refund in fixed_window.rs); true
  -- when the state changed.
  function fixed.refund(s, now, p, cost)
    if s[1] ~= idiv(now, p.window) or s[2] == 0 or cost == 0 then
      return false
    end
    s[2] = max(s[2] - cost, 0)
    return true
  end

  -- Charges `extra` whether or not it fits, never beyond the limit (overcharge in
  -- fixed_window.rs); true when the state changed.
  function fixed.overcharge(s, now, p, extra)
    local idx = idiv(now, p.window)
    local count = fixed_count(s, idx)
    s[1], s[2] = idx, min(count + extra, max(count, p.limit))
    return true
  end

  function fixed.expires_at(s, p)
    return (s[1] + 1) * p.window
  end

  return fixed
end
