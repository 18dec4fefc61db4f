-- Token bucket: one string per (key, policy) holding {deficit, updated_at}; the deficit is
-- missing tokens x W, refilled by N per ms. The arithmetic is src/algorithm/token_bucket.rs.
ALG[ALG_TOKEN_BUCKET] = function()
  local bucket = packed('<dd', '<ddB', 16)

  function bucket.fresh()
    return { 0, 0 }
  end

  local function bucket_deficit(s, now, n)
    local elapsed = max(now - s[2], 0)
    return max(s[1] - elapsed * n, 0)
  end

  -- With `charge`, an allowed request is also committed (what `commit` does). Taken once per
  -- request of a batch, so `bucket_deficit`, `idiv`, `ceil_div` and `max` are inline: each
  -- call costs more than its arithmetic.
  -- A cost above the capacity never fits (never_fits in mod.rs).
  function bucket.evaluate(s, now, p, cost, charge)
    if cost > p.capacity then
      local _, remaining, reset_after = bucket.evaluate(s, now, p, 0)
      return false, remaining, reset_after, reset_after, 0
    end
    local n, w = p.limit, p.window
    local full = p.capacity * w
    local elapsed = now - s[2]
    if 0 > elapsed then
      elapsed = 0
    end
    local deficit = s[1] - elapsed * n
    if 0 > deficit then
      deficit = 0
    end
    local allowed = deficit + cost * w <= full
    local after = deficit
    local retry_after = 0
    if allowed then
      after = deficit + cost * w
      if charge then
        local updated = now
        if s[2] > updated then
          updated = s[2]
        end
        s[1], s[2] = after, updated
      end
    else
      retry_after = ceil_div(deficit + cost * w - full, n)
    end
    local room = full - after
    if 0 > room then
      room = 0
    end
    local remaining = floor(room / w)
    if remaining * w > room then
      remaining = remaining - 1
    elseif (remaining + 1) * w <= room then
      remaining = remaining + 1
    end
    local reset_after = floor(after / n)
    if reset_after * n > after then
      reset_after = reset_after - 1
    elseif (reset_after + 1) * n <= after then
      reset_after = reset_after + 1
    end
    if after - reset_after * n > 0 then
      reset_after = reset_after + 1
    end
    return allowed, remaining, reset_after, retry_after, 0
  end

  function bucket.commit(s, now, p, cost)
    local deficit = bucket_deficit(s, now, p.limit)
    s[1], s[2] = min(deficit + cost * p.window, max(deficit, MAX_USAGE_WINDOW_PRODUCT)), max(now, s[2])
  end

  -- Puts up to `cost` tokens back, never beyond full (refund in token_bucket.rs); true when
  -- the state changed.
  function bucket.refund(s, now, p, cost)
    local deficit = bucket_deficit(s, now, p.limit)
    if deficit == 0 or cost == 0 then
      return false
    end
    s[1], s[2] = max(deficit - cost * p.window, 0), max(now, s[2])
    return true
  end

  -- Takes `extra` tokens into debt, in full, at most a deficit of MAX_USAGE_WINDOW_PRODUCT
  -- (overcharge in token_bucket.rs); true when the state changed.
  function bucket.overcharge(s, now, p, extra)
    local w = p.window
    local deficit = bucket_deficit(s, now, p.limit)
    s[1], s[2] = min(deficit + extra * w, max(deficit, MAX_USAGE_WINDOW_PRODUCT)), max(now, s[2])
    return true
  end

  -- When the deficit is refilled. With a per-key override, at the slower of its rate and the
  -- plan's: the override can end (its TTL, or removal) with no write to move the key's TTL,
  -- and the plan's rate then refills what is left.
  function bucket.expires_at(s, p)
    return s[2] + ceil_div(s[1], p.slowest or p.limit)
  end

  -- No later than expires_at under any limit: the key's TTL may have been set under another
  -- one (an override set or removed since), so only this part of it is known.
  function bucket.kept_since(s)
    if s[1] > 0 then
      return s[2] + 1
    end
    return s[2]
  end

  return bucket
end
