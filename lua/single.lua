-- tollgate: the clock, then the common call decided before anything else is defined. The
-- upper-case names (TTL_MARGIN_MS, ALG_GCRA, MODE_CHARGE, …) are the constants shared with
-- Rust (lua/constants.lua): their values are written in when the script is assembled.
--
-- ARGV[1]: now in ms, or "" to read the server clock (TIME); one instant for the whole call.
-- TIME's two decimal strings are converted by the arithmetic, once each: `tonumber` converts
-- a string twice (lua_isnumber, then lua_tonumber), and each conversion is a `strtod` of
-- ~450 instructions of Redis.
local now = ARGV[1] ~= '' and tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = t[1] * 1000 + math.floor(t[2] / 1000)
end

-- The common call is one request charging (or peeking) one state of one policy of the
-- sliding window counter, token bucket, fixed window or GCRA. Defining the functions and
-- tables of the general path below costs Redis more than the decision itself (every call of
-- a script runs its whole text again: each function definition creates a closure, each
-- table is garbage to collect), so that call is decided here with locals only, in the same
-- arithmetic as the algorithm's file in lua/ (and src/algorithm/), and answered in the same
-- layout. (Calling sliding_window_counter_math.lua instead of the counter's copy below,
-- defined before this text, cost a lone counter decision about 10 000 more instructions of
-- Redis, 16 %, and a lone token bucket decision about 3 500, 5 %.) Anything else — a batch,
-- several policies, a refund, a state that is missing because its key holds another type,
-- or an unreadable one — falls through to the general path, which has done nothing yet.
--
-- A call of one policy and one state sends its three binary strings (decide.lua) as one
-- ARGV[2]: one argument and one struct.unpack cost Redis less than three of each. For one
-- request of one policy it is LONE_REQUEST_BYTES: the policy (5 f64), the state's policy
-- (u32, 1), then the request (mode u8, m u32, state u32, cost f64).
repeat
  local one = ARGV[2]
  if #KEYS ~= 2 or #ARGV ~= 2 or #one ~= LONE_REQUEST_BYTES then
    break
  end
  local unpack_struct, pack, floor, max, min = struct.unpack, struct.pack, math.floor, math.max, math.min
  local id, n, w, capacity, max_delay, sp, mode, m, i, cost = unpack_struct('<dddddI4BI4I4d', one)
  if sp ~= 1 or mode > MODE_CHARGE or m ~= 1 or i ~= 1 then
    break
  end
  local size
  if id == ALG_SLIDING_WINDOW_COUNTER then
    size = 24
  elseif id == ALG_TOKEN_BUCKET or id == ALG_FIXED_WINDOW or id == ALG_GCRA then
    size = 16
  else
    break
  end
  local charge = mode == MODE_CHARGE
  local key = KEYS[1]
  local v = redis.call('GET', key)
  local s1, s2, s3 = 0, 0, 0
  local fresh = not v
  -- The override is read only when the state does not end with NO_OVERRIDE_MARK (the
  -- override mark in prelude.lua): a state written with the mark had no override then, and
  -- setting one takes the mark off (set_override.lua).
  local unmarked = true
  if fresh then
    -- GET answers nil for a key of another type too: the general path reports it.
    if redis.call('EXISTS', key) == 1 then
      break
    end
  elseif #v == size + 1 then
    unmarked = false
  elseif #v ~= size then
    break
  end
  if not fresh then
    if size == 24 then
      s1, s2, s3 = unpack_struct('<ddd', v)
    else
      s1, s2 = unpack_struct('<dd', v)
    end
  end
  local overridden = false
  local plan_n = n
  if unmarked then
    local o = redis.call('GET', KEYS[2])
    if o and #o == 16 then
      n, capacity = unpack_struct('<dd', o)
      overridden = true
    end
  end
  -- A cost above the capacity (which never fits, or fits only by shaping's delay), and a
  -- window's count past the limit (a settlement's debt, carried into the next windows), are
  -- decided by the general path.
  if cost > capacity or (size == 24 or id == ALG_FIXED_WINDOW) and s2 > n then
    break
  end
  -- Every division below is floor(a / b) for integers a >= 0, b >= 1 (idiv in prelude.lua),
  -- written out: `q = floor(a / b)` and the two corrections that keep it exact past 2^53.
  -- A local `idiv` function would be a closure created on every call, which costs Redis
  -- about 1 000 instructions.

  -- allowed, remaining, reset_after, retry_after, delay; with `write`, the new state and
  -- when it expires (`expires_at`), and `was`: no later than when the state as read expired
  -- under the policy it was written with (see `kept_since` in the algorithm's file).
  local allowed, remaining, reset_after, retry_after, delay = false, 0, 0, 0, 0
  local write, expires_at, was = false, nil, nil
  if id == ALG_SLIDING_WINDOW_COUNTER then
    -- Sliding window counter (sliding_window_counter.lua: evaluate; earliest in
    -- sliding_window_counter_math.lua).
    if not fresh then
      was = (s1 + 2) * w
    end
    local idx = floor(now / w)
    if idx * w > now then idx = idx - 1 elseif (idx + 1) * w <= now then idx = idx + 1 end
    local e = now - idx * w
    local prev, cur = 0, 0
    if s1 == idx then
      prev, cur = s3, s2
    elseif s1 + 1 == idx then
      prev, cur = s2, 0
    end
    local weighted = prev * (w - e) + cur * w
    allowed = weighted + cost * w <= n * w
    local weighted_after, cur_after = weighted, cur
    if allowed then
      weighted_after, cur_after = weighted + cost * w, cur + cost
      if charge then
        s1, s2, s3 = idx, cur + cost, prev
        write, expires_at = true, (s1 + 2) * w
        if s2 > plan_n then
          -- Past the plan's limit under an override that raised it: kept until the plan's
          -- limit would have paid it off (sliding_window_counter.lua: expires_at).
          local a = s2 + plan_n - 1
          local q = floor(a / plan_n)
          if q * plan_n > a then q = q - 1 elseif (q + 1) * plan_n <= a then q = q + 1 end
          expires_at = (s1 + 1 + q) * w
        end
      end
    end
    local room = max(n * w - weighted_after, 0)
    remaining = floor(room / w)
    if remaining * w > room then
      remaining = remaining - 1
    elseif (remaining + 1) * w <= room then
      remaining = remaining + 1
    end
    if cur_after > 0 then
      reset_after = (idx + 2) * w - now
    elseif prev > 0 then
      reset_after = (idx + 1) * w - now
    end
    if not allowed then
      local start, earliest = idx * w, nil
      if cur + cost <= n then
        if prev == 0 then
          earliest = now
        else
          local a = (n - cur - cost) * w
          local overlap = floor(a / prev)
          if overlap * prev > a then
            overlap = overlap - 1
          elseif (overlap + 1) * prev <= a then
            overlap = overlap + 1
          end
          if overlap >= 1 then
            earliest = max(start + w - min(overlap, w), now)
          end
        end
      end
      if not earliest then
        local next_start = start + w
        if cur == 0 then
          earliest = next_start
        else
          local a = (n - cost) * w
          local overlap = floor(a / cur)
          if overlap * cur > a then
            overlap = overlap - 1
          elseif (overlap + 1) * cur <= a then
            overlap = overlap + 1
          end
          if overlap >= 1 then
            earliest = next_start + w - min(overlap, w)
          else
            earliest = next_start + w
          end
        end
      end
      retry_after = earliest - now
    end
  elseif id == ALG_FIXED_WINDOW then
    -- Fixed window (fixed_window.lua: evaluate).
    if not fresh then
      was = (s1 + 1) * w
    end
    local idx = floor(now / w)
    if idx * w > now then idx = idx - 1 elseif (idx + 1) * w <= now then idx = idx + 1 end
    local count = 0
    if s1 == idx then
      count = s2
    end
    local window_end = (idx + 1) * w - now
    allowed = count + cost <= n
    local after = count
    if allowed then
      after = count + cost
      if charge then
        s1, s2 = idx, after
        write, expires_at = true, (idx + 1) * w
        if after > plan_n then
          -- Past the plan's limit under an override that raised it (fixed_window.lua:
          -- expires_at).
          local a = after + plan_n - 1
          local q = floor(a / plan_n)
          if q * plan_n > a then q = q - 1 elseif (q + 1) * plan_n <= a then q = q + 1 end
          expires_at = (idx + q) * w
        end
      end
    end
    if after > 0 then
      reset_after = window_end
    end
    remaining, retry_after = max(n - after, 0), window_end
  else
    -- ceil(a / b) for integers a >= 0, b >= 1 (ceil_div in prelude.lua), inline below.
    -- `top`: the units the key may hold (times the window); `held`: what it holds now, with
    -- this request when it was allowed, without it when not.
    local q, top, held
    if id == ALG_GCRA then
      -- GCRA (gcra.lua: evaluate, expires_at).
      if not fresh then
        was = s1
        if s2 > 0 then
          was = s1 + 1
        end
      end
      local tolerance, slack = capacity * w, max_delay * n
      local backlog = 0
      if s1 >= now then
        backlog = min((s1 - now) * n + min(s2, n - 1), MAX_USAGE_WINDOW_PRODUCT)
      end
      local after = backlog + cost * w
      allowed = after <= tolerance + slack
      if allowed then
        if charge then
          local whole = floor(after / n)
          if whole * n > after then
            whole = whole - 1
          elseif (whole + 1) * n <= after then
            whole = whole + 1
          end
          s1, s2 = now + whole, after - whole * n
          write, expires_at = true, s1
          if s2 > 0 then
            expires_at = s1 + 1
          end
        end
        local late = max(after - tolerance, 0)
        q = floor(late / n)
        if q * n > late then q = q - 1 elseif (q + 1) * n <= late then q = q + 1 end
        if late - q * n > 0 then
          q = q + 1
        end
        delay = q
      else
        local over = after - tolerance - slack
        q = floor(over / n)
        if q * n > over then q = q - 1 elseif (q + 1) * n <= over then q = q + 1 end
        if over - q * n > 0 then
          q = q + 1
        end
        retry_after = q
      end
      top, held = tolerance, allowed and after or backlog
    else
      -- Token bucket (token_bucket.lua: evaluate, expires_at, kept_since). The state's
      -- expiry depends on the limit, which an override may have changed since the key's
      -- TTL was set: `was` is the part that does not.
      if not fresh then
        was = s2
        if s1 > 0 then
          was = s2 + 1
        end
      end
      local full = capacity * w
      local deficit = max(s1 - max(now - s2, 0) * n, 0)
      allowed = deficit + cost * w <= full
      local after = deficit
      if allowed then
        after = deficit + cost * w
        if charge then
          s1, s2 = after, max(now, s2)
          -- Kept until the deficit would be refilled at the slower of the plan's rate and
          -- an override's (token_bucket.lua: expires_at): the override can end, by its
          -- TTL or removal, with no write to move the key's.
          local slow = min(n, plan_n)
          q = floor(s1 / slow)
          if q * slow > s1 then q = q - 1 elseif (q + 1) * slow <= s1 then q = q + 1 end
          if s1 - q * slow > 0 then
            q = q + 1
          end
          write, expires_at = true, s2 + q
        end
      else
        local over = deficit + cost * w - full
        q = floor(over / n)
        if q * n > over then q = q - 1 elseif (q + 1) * n <= over then q = q + 1 end
        if over - q * n > 0 then
          q = q + 1
        end
        retry_after = q
      end
      top, held = full, after
    end
    -- What remains and when it resets, alike for both.
    local x = max(top - held, 0)
    remaining = floor(x / w)
    if remaining * w > x then
      remaining = remaining - 1
    elseif (remaining + 1) * w <= x then
      remaining = remaining + 1
    end
    q = floor(held / n)
    if q * n > held then q = q - 1 elseif (q + 1) * n <= held then q = q + 1 end
    if held - q * n > 0 then
      q = q + 1
    end
    reset_after = q
  end

  if write then
    -- Marked when no override is in force (the override mark in prelude.lua).
    local state
    if overridden then
      if size == 24 then
        state = pack('<ddd', s1, s2, s3)
      else
        state = pack('<dd', s1, s2)
      end
    elseif size == 24 then
      state = pack('<dddB', s1, s2, s3, NO_OVERRIDE_MARK)
    else
      state = pack('<ddB', s1, s2, NO_OVERRIDE_MARK)
    end
    -- The key expires on a grid (the expiry and keep rules in prelude.lua): at the first
    -- multiple of TTL_GRID_MS at or after expires_at + TTL_MARGIN_MS, so between
    -- TTL_MARGIN_MS - TTL_GRID_MS and TTL_MARGIN_MS + TTL_GRID_MS after the state stops
    -- mattering. The TTL the key has is kept when the state as read had its expiry in the
    -- same cell of the grid: a write of GCRA or the bucket moves the expiry by a fraction
    -- of a grid step, and `SET … KEEPTTL` costs Redis less than `SET … PX <ttl>`. Every
    -- branch above leaves expires_at >= now, so the TTL is at least TTL_MARGIN_MS.
    local keep = expires_at == was
    if not keep then
      local target = expires_at + TTL_MARGIN_MS
      target = target + (-target) % TTL_GRID_MS
      if was then
        local t = was + TTL_MARGIN_MS
        keep = t <= target and t > target - TTL_GRID_MS
      end
      if not keep then
        redis.call('SET', key, state, 'PX', target - now)
      end
    end
    if keep then
      redis.call('SET', key, state, 'KEEPTTL')
    end
  end
  local a = allowed and 1 or 0
  if overridden then
    if max_delay > 0 then
      -- A shaping policy's override sends its limit too: what the longest wait admits.
      return pack('<bbdddddd', a, a + 2, remaining, reset_after, retry_after, delay, capacity, n)
    end
    return pack('<bbddddd', a, a + 2, remaining, reset_after, retry_after, delay, capacity)
  end
  return pack('<bbdddd', a, a, remaining, reset_after, retry_after, delay)
until true
