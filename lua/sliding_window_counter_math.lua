-- tollgate: the sliding window counter's arithmetic, src/algorithm/sliding_window_counter.rs
-- line for line, shared by the decision script (sliding_window_counter.lua) and the lease
-- ledger (lease.lua). Built by a call, so that a script that decides no counter defines none
-- of it: every call of a script runs its whole text again, and each function definition
-- creates a closure. (single.lua keeps its own copy of the common case: see there.)
--
-- A state is {window, current, previous}: the window index of the last charge and the units
-- charged in it and in the window before. A count past the limit (a settlement's debt) is
-- carried into the next windows, n paid per window.
--
-- Returns counts, weighted, earliest and clears_in.
local function sliding_window_counter_math()
  -- (previous, current) j >= 1 windows after a window that counted c (`carried`). A product
  -- past 2^53 is inexact, but then above c, and the difference is clamped to 0 as the Rust
  -- saturates.
  local function carried(c, j, n)
    local left = max(c - n * (j - 1), 0)
    return min(left, n), max(left - n, 0)
  end

  -- (previous, current) as seen from window idx (`counts`).
  local function counts(window, current, previous, idx, n)
    if window == idx then
      return previous, current
    elseif window < idx then
      return carried(current, idx - window, n)
    end
    return 0, 0
  end

  -- The estimate of the last window at offset e into the current one, scaled by w
  -- (`weighted`): the previous window's count weighs (w - e) / w, the current one in full.
  local function weighted(prev, cur, e, w)
    return prev * (w - e) + cur * w
  end

  -- The earliest offset into a window with counts (prev, cur) at which `cost` fits, or nil
  -- (`fits_from`).
  local function fits_from(prev, cur, n, w, cost)
    local room = n - cur - cost
    if room < 0 then
      return nil
    end
    if prev == 0 then
      return 0
    end
    local overlap = idiv(room * w, prev)
    if overlap >= 1 then
      return w - min(overlap, w)
    end
    return nil
  end

  -- The earliest time at which a request of `cost` <= n passes, given counts (prev, cur) in
  -- window idx, searching from `now` (`earliest`).
  local function earliest(prev, cur, idx, now, n, w, cost)
    local start = idx * w
    local e = fits_from(prev, cur, n, w, cost)
    if e then
      return max(start + e, now)
    end
    local first = max(ceil_div(max(cur + cost - n, 0), n), 1)
    for j = first, first + 1 do
      local p, c = carried(cur, j, n)
      e = fits_from(p, c, n, w, cost)
      if e then
        return start + j * w + e
      end
    end
    return start + (first + 2) * w
  end

  -- Time from `now` (in window idx) until the estimate is 0, after a decision leaving counts
  -- (prev, cur) (`clears_in`).
  local function clears_in(prev, cur, idx, now, n, w)
    if cur > 0 then
      return (idx + ceil_div(cur, n) + 1) * w - now
    elseif prev > 0 then
      return (idx + 1) * w - now
    end
    return 0
  end

  return counts, weighted, earliest, clears_in
end
