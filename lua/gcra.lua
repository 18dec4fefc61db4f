-- GCRA: one string per (key, policy) holding {tat, frac} (the theoretical arrival time in
-- whole ms plus a remainder in 1/N ms). The arithmetic is src/algorithm/gcra.rs, shaping
-- included.
ALG[ALG_GCRA] = function()
  local gcra = packed('<dd', '<ddB', 16)

  function gcra.fresh()
    return { 0, 0 }
  end

  -- backlog in gcra.rs: a remainder written under a higher limit reads as at most
  -- (n - 1) / n ms, and a debt past MAX_USAGE_WINDOW_PRODUCT saturates (a product past 2^53
  -- is inexact, but then past the cap too).
  local function gcra_backlog(s, now, n)
    if s[1] >= now then
      return min((s[1] - now) * n + min(s[2], n - 1), MAX_USAGE_WINDOW_PRODUCT)
    end
    return 0
  end

  -- With `charge`, an allowed request is also committed (what `commit` does). Taken once per
  -- request of a batch, so on the allowing path `gcra_backlog`, `idiv`, `ceil_div` and `max`
  -- are inline (each call costs more than its arithmetic), and idiv(after, n) serves both the
  -- new TAT and ceil_div(after, n).
  -- A cost that not even a fresh meter takes, waiting the longest delay, never fits
  -- (never_fits in mod.rs).
  function gcra.evaluate(s, now, p, cost, charge)
    local n, w = p.limit, p.window
    local tolerance = p.capacity * w
    local slack = p.max_delay * n
    if cost > p.capacity and cost > idiv(tolerance + slack, w) then
      local _, remaining, reset_after = gcra.evaluate(s, now, p, 0)
      return false, remaining, reset_after, reset_after, 0
    end
    local backlog = 0
    if s[1] >= now then
      backlog = min((s[1] - now) * n + min(s[2], n - 1), MAX_USAGE_WINDOW_PRODUCT)
    end
    local after = backlog + cost * w
    local allowed = after <= tolerance + slack
    if allowed then
      local whole = floor(after / n)
      if whole * n > after then
        whole = whole - 1
      elseif (whole + 1) * n <= after then
        whole = whole + 1
      end
      local frac = after - whole * n
      if charge then
        s[1], s[2] = now + whole, frac
      end
      local reset_after = whole
      if frac > 0 then
        reset_after = whole + 1
      end
      local delay = 0
      if after - tolerance > 0 then
        delay = ceil_div(after - tolerance, n)
      end
      local room, remaining = tolerance - after, 0
      if room > 0 then
        remaining = floor(room / w)
        if remaining * w > room then
          remaining = remaining - 1
        elseif (remaining + 1) * w <= room then
          remaining = remaining + 1
        end
      end
      return true, remaining, reset_after, 0, delay
    end
    local retry_after = ceil_div(after - tolerance - slack, n)
    return false, idiv(max(tolerance - backlog, 0), w), ceil_div(backlog, n), retry_after, 0
  end

  function gcra.commit(s, now, p, cost)
    local n = p.limit
    local backlog = gcra_backlog(s, now, n)
    local after = min(backlog + cost * p.window, max(backlog, MAX_USAGE_WINDOW_PRODUCT))
    local whole = idiv(after, n)
    s[1], s[2] = now + whole, after - whole * n
  end

  -- Moves the TAT back by up to `cost` intervals, never before now (refund in gcra.rs); true
  -- when the state changed.
  function gcra.refund(s, now, p, cost)
    local n = p.limit
    local backlog = gcra_backlog(s, now, n)
    if backlog == 0 or cost == 0 then
      return false
    end
    local after = max(backlog - cost * p.window, 0)
    local whole = idiv(after, n)
    s[1], s[2] = now + whole, after - whole * n
    return true
  end

  -- Moves the TAT by `extra` intervals whether or not they fit, in full (a debt of time), at
  -- most a backlog of MAX_USAGE_WINDOW_PRODUCT (overcharge in gcra.rs); true when the state
  -- changed.
  function gcra.overcharge(s, now, p, extra)
    local n, w = p.limit, p.window
    local backlog = gcra_backlog(s, now, n)
    local after = min(backlog + extra * w, max(backlog, MAX_USAGE_WINDOW_PRODUCT))
    local whole = idiv(after, n)
    s[1], s[2] = now + whole, after - whole * n
    return true
  end

  function gcra.expires_at(s)
    if s[2] > 0 then
      return s[1] + 1
    end
    return s[1]
  end

  return gcra
end
