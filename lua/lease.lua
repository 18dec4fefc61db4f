-- tollgate: the lease ledger (src/store/leased/ledger/ is the same arithmetic in Rust).
--
-- One call grants a block of units of every policy of a request (all or nothing), decides
-- one request exactly (a block of `cost` used at once), peeks, gives unused units back, or
-- charges extra units whatever the state (a cost settled above its reservation).
--
-- KEYS: per policy its ledger state, then (sliding window log only) the units of each of its
--       entries, then the key's override of the policy (the exact store's override key: two
--       little-endian doubles, limit and capacity; absent when there is none).
-- ARGV: mode (LEDGER_GRANT, LEDGER_PEEK, LEDGER_RETURN, LEDGER_FORCE, LEDGER_RESET or
--       LEDGER_KEEP, one letter each), now ('' reads TIME), the lease a grant asks for in ms
--       (0: no block, the request decided exactly), the block id, the id of the block a
--       grant gives back first ('0': none), then one binary string: eleven little-endian
--       doubles (whole numbers, LEDGER_PART_BYTES) per policy (LedgerCall in
--       src/store/leased/ledger/call.rs):
--         kind (KIND_COUNTER, KIND_LOG, KIND_BUCKET for the bucket and GCRA, KIND_FIXED),
--         limit N, window W in ms, capacity C (the plan's N and C: an override in force
--         replaces them),
--         cost: a grant's or a peek's cost; a force's extra units (a debt, never forgiven:
--           as the exact algorithms' overcharge),
--         wanted: the most units a grant's block may hold,
--         then the block given back (a return's, or the one a grant gives back first): the
--         units it was granted, the units it leaves unused, when it was granted, its lease,
--         and the limit in force when it was granted (0: unknown).
--       keep: an override was just set; each bucket's state key is kept at least as long as
--       its deficit needs at the override's refill rate.
-- Reply: binary, little-endian doubles holding whole numbers (no number is formatted as
--        text: `string.format` of a float was a tenth of a cold decision's cost in Redis):
--        allowed, the lease granted (0: none, the request decided exactly), now, the number
--        of answers (0 or one per policy), then per answer granted, remaining, reset_after,
--        retry_after, and the limit and capacity in force. A force answers no answers, and
--        allowed 0 when a debt stands afterwards (a policy past its limit: not even a cost
--        of 0 fits).
--
-- A batch of calls (ARGV[1] LEDGER_BATCH): ARGV: LEDGER_BATCH, now, the number of calls, then
-- per call its mode, lease, block id, previous block id and binary string; KEYS: each call's
-- keys in turn.
-- The calls run in order, each against the state the earlier ones left, exactly as if sent
-- one by one at the same instant; the reply is each call's reply, one after the other (each
-- says how many answers it holds).
--
-- The script is integers.lua (floor, max, min, idiv, ceil_div, int, …), then
-- sliding_window_counter_math.lua, then this text. The upper-case names are the constants
-- shared with Rust (lua/constants.lua), written in when the script is assembled. Policies
-- keep capacity x window within MAX_CAPACITY_WINDOW_PRODUCT (exact in doubles); an override
-- that does not is ignored, as is anything in an override key that is not one. A
-- settlement's debt saturates at MAX_USAGE_WINDOW_PRODUCT (units x window), so every count x
-- window stays below 2^53. An extra charge above 2^53 arrives rounded; it is compared with,
-- or clamped to, far smaller numbers only, which rounding cannot reach (round to nearest is
-- monotone).
-- The fixed window's count in window idx from its state {x, y} (`count_at`).
local function fixed_count(x, y, idx, n)
  if x == idx then
    return y
  elseif x < idx then
    return max(y - n * (idx - x), 0)
  end
  return 0
end

-- The limit and capacity of an override key's value `v` for window `w`, or nil.
local function usable(v, w)
  if not v or #v ~= 16 then
    return nil
  end
  local limit, cap = unpack_struct('<dd', v)
  if limit >= 1 and cap >= 1 and limit == floor(limit) and cap == floor(cap)
    and limit * w <= MAX_CAPACITY_WINDOW_PRODUCT and cap * w <= MAX_CAPACITY_WINDOW_PRODUCT then
    return limit, cap
  end
  return nil
end

local now
if ARGV[2] ~= '' then
  now = tonumber(ARGV[2])
else
  local t = redis.call('TIME')
  -- Converted by the arithmetic, once each (see single.lua).
  now = t[1] * 1000 + floor(t[2] / 1000)
end

-- The common call, decided with locals only, before the general path's functions are defined
-- (every script call builds each of them again as a closure, and the general path's policy
-- tables are garbage to collect): one request of one counter, fixed window or token bucket /
-- GCRA policy that has room, charged at once (a grant with no lease and no block to give
-- back) or peeked, as a cold key's decisions are. The arithmetic is that of load(), most(),
-- charge() and view() below for those kinds (and of src/store/leased/ledger/; the
-- differential tests in ledger/tests/ hold all three to the same replies); the counter's is
-- sliding_window_counter_math.lua's, inline: building that here cost a cold counter call
-- about 10 000 more instructions of Redis (11 %), and every other cold call about 2 500
-- (its closures' upvalues). Anything else, a refusal included,
-- answers nil and goes to the general path, which reads the state afresh: nothing was written.
-- `key` is the state, `okey` the override.
local function quick(mode, lease, previous_block, blob, key, okey)
  if #blob ~= LEDGER_PART_BYTES or previous_block ~= '0'
    or not (mode == LEDGER_PEEK or (mode == LEDGER_GRANT and lease == 0)) then
    return nil
  end
  local kind, n, w, cap, cost = unpack_struct('<ddddd', blob)
  if kind ~= KIND_COUNTER and kind ~= KIND_BUCKET and kind ~= KIND_FIXED then
    return nil
  end
  local both = redis.call('MGET', key, okey)
  local v = both[1]
  -- A key is kept for the slower of the plan's limit and the override's: the override can
  -- end with nothing written (and a count past the plan's limit is then a debt).
  local slowest = n
  local on, oc = usable(both[2], w)
  if on then
    n, cap, slowest = on, oc, min(n, on)
  end
  local x, y, z = 0, 0, 0
  if v then
    x, y, z = unpack_struct('<ddd', v)
  end
  local remaining, reset = 0, 0
  if kind == KIND_BUCKET then
    local deficit = max(x - max(now - y, 0) * n, 0)
    local room = cap * w - deficit
    if room < 0 or idiv(room, w) < cost then
      return nil
    end
    deficit = deficit + cost * w
    if mode == LEDGER_GRANT then
      -- The deficit drains from max(now, y): a server clock stepped back keeps the key
      -- that much longer, as the general path does.
      local from = max(now, y)
      redis.call('SET', key, pack('<ddd', deficit, from, 0),
        'PX', from - now + ceil_div(deficit, slowest) + TTL_MARGIN_MS)
    end
    remaining, reset = idiv(max(cap * w - deficit, 0), w), ceil_div(deficit, n)
  else
    local idx = idiv(now, w)
    local prev, cur = 0, 0
    if kind == KIND_COUNTER then
      -- counts and carried of sliding_window_counter_math.lua, inline.
      if x == idx then
        prev, cur = z, y
      elseif x < idx then
        local left = max(y - n * (idx - x - 1), 0)
        prev, cur = min(left, n), max(left - n, 0)
      end
    else
      cur = fixed_count(x, y, idx, n)
    end
    if kind == KIND_FIXED then
      if n - cur < cost then
        return nil
      end
    else
      local e = now - idx * w
      local room = n * w - (prev * (w - e) + cur * w)
      if room < 0 or idiv(room, w) < cost then
        return nil
      end
    end
    cur = cur + cost
    if kind == KIND_FIXED then
      if mode == LEDGER_GRANT then
        redis.call('SET', key, pack('<ddd', idx, cur, 0),
          'PX', (idx + max(ceil_div(cur, slowest), 1)) * w - now + TTL_MARGIN_MS)
      end
      remaining = max(n - cur, 0)
      if cur > 0 then
        reset = (idx + 1) * w - now
      end
    else
      if mode == LEDGER_GRANT then
        redis.call('SET', key, pack('<ddd', idx, cur, prev),
          'PX', (idx + max(ceil_div(cur, slowest), 1) + 1) * w - now + TTL_MARGIN_MS)
      end
      -- Room was left, so cur <= n: the estimate clears at the end of the next window.
      local e = now - idx * w
      remaining = idiv(max(n * w - (prev * (w - e) + cur * w), 0), w)
      if cur > 0 then
        reset = (idx + 2) * w - now
      elseif prev > 0 then
        reset = (idx + 1) * w - now
      end
    end
  end
  return pack('<dddddddddd', 1, 0, now, 1, cost, remaining, reset, 0, n, cap)
end

if ARGV[1] ~= LEDGER_BATCH then
  local reply = quick(ARGV[1], tonumber(ARGV[3]), ARGV[5], ARGV[6], KEYS[1], KEYS[2])
  if reply then
    return reply
  end
end

-- The general path: the counter's arithmetic, shared with the decision script.
local counter_counts, counter_weighted, counter_earliest, counter_clears_in =
  sliding_window_counter_math()

-- The policies of a call from its binary string, their keys after KEYS[k]; how many; and the
-- index of their last key. A policy with an override in force decides with its limit and
-- capacity (`plan_limit`: the plan's, for the TTLs).
-- Each table is built whole, with the fields load() fills, so it is allocated once.
local function policies(blob, k)
  local P, pos, count = {}, 1, floor(#blob / LEDGER_PART_BYTES)
  local okeys = {}
  for i = 1, count do
    local kind, limit, window, capacity, cost, wanted, back_granted, back_unused, back_granted_at,
      back_lease, back_rate
    kind, limit, window, capacity, cost, wanted, back_granted, back_unused, back_granted_at,
      back_lease, back_rate, pos = unpack_struct('<ddddddddddd', blob, pos)
    P[i] = {
      key = KEYS[k + 1], units_key = false, kind = kind, limit = limit, window = window,
      capacity = capacity, plan_limit = limit, cost = cost, wanted = wanted,
      back_granted = back_granted, back_unused = back_unused, back_granted_at = back_granted_at,
      back_lease = back_lease, back_rate = back_rate,
      idx = 0, prev = 0, cur = 0, stored_window = 0, stored_current = 0, stored_previous = 0,
      deficit = 0, updated = 0, entries = false, used = 0,
    }
    k = k + 1
    if kind == KIND_LOG then
      P[i].units_key = KEYS[k + 1]
      k = k + 1
    end
    okeys[i] = KEYS[k + 1]
    k = k + 1
  end
  if count > 0 then
    local values = redis.call('MGET', unpack(okeys))
    for i = 1, count do
      local p = P[i]
      local on, oc = usable(values[i], p.window)
      if on then
        p.limit, p.capacity = on, oc
      end
    end
  end
  return P, count, k
end

-- Loading: one string of three little-endian doubles: counter {w, c, p}, fixed {w, c, 0},
-- bucket {d, u, 0}; the log reads its live units (a sorted set and a hash).
local function load(p)
  if p.kind == KIND_LOG then
    local dead = redis.call('ZRANGEBYSCORE', p.key, '-inf', now - p.window)
    if #dead > 0 then
      redis.call('ZREMRANGEBYSCORE', p.key, '-inf', now - p.window)
      redis.call('HDEL', p.units_key, unpack(dead))
    end
    local live = redis.call('ZRANGEBYSCORE', p.key, '(' .. int(now - p.window), '+inf', 'WITHSCORES')
    local entries, used = {}, 0
    for j = 1, #live, 2 do
      local u = tonumber(redis.call('HGET', p.units_key, live[j]) or '0')
      entries[#entries + 1] = { tonumber(live[j + 1]), u }
      used = used + u
    end
    p.entries, p.used = entries, used
    return
  end
  local v = redis.call('GET', p.key)
  local x, y, z = 0, 0, 0
  if v then
    x, y, z = unpack_struct('<ddd', v)
  end
  local idx = idiv(now, p.window)
  p.idx = idx
  if p.kind == KIND_COUNTER then
    p.prev, p.cur = counter_counts(x, y, z, idx, p.limit)
    p.stored_window, p.stored_current, p.stored_previous = x, y, z
  elseif p.kind == KIND_FIXED then
    p.cur = fixed_count(x, y, idx, p.limit)
    p.stored_window, p.stored_current = x, y
  else
    local elapsed = max(now - y, 0)
    p.deficit = max(x - elapsed * p.limit, 0)
    p.updated = y
  end
end

-- The most units a block lent for `t` ms may hold now (negative: not even one).
local function most(p, t)
  if p.kind == KIND_COUNTER then
    local room = p.limit * p.window
      - counter_weighted(p.prev, p.cur, now - p.idx * p.window, p.window)
    if room < 0 then
      return -1
    end
    return idiv(room, p.window)
  elseif p.kind == KIND_LOG then
    return p.limit - p.used
  elseif p.kind == KIND_FIXED then
    return p.limit - p.cur
  else
    local room = p.capacity * p.window - p.deficit - p.limit * t
    if room < 0 then
      return -1
    end
    return idiv(room, p.window)
  end
end

-- Time until the fixed window's count is paid off (clears_in in fixed_window.rs).
local function fixed_clears(p)
  if p.cur == 0 then
    return 0
  end
  return (p.idx + ceil_div(p.cur, p.limit)) * p.window - now
end

-- How long until a request of `cost` passes if nothing else happens (exact, no lease).
local function retry(p, cost)
  if p.kind == KIND_COUNTER then
    if cost > p.limit then
      -- Never passes; asked again once the counter has forgotten everything (its debt
      -- paid), and no sooner than two windows.
      return max(counter_clears_in(p.prev, p.cur, p.idx, now, p.limit, p.window), 2 * p.window)
    end
    return max(counter_earliest(p.prev, p.cur, p.idx, now, p.limit, p.window, cost) - now, 1)
  elseif p.kind == KIND_LOG then
    table.sort(p.entries, function(l, r) return l[1] < r[1] end)
    local freed, at = 0, now + p.window
    for _, e in ipairs(p.entries) do
      freed = freed + e[2]
      at = e[1] + p.window
      if p.used - freed + cost <= p.limit then
        break
      end
    end
    return max(at - now, 1)
  elseif p.kind == KIND_FIXED then
    if cost > p.limit then
      -- Never passes; asked again once the window's count (its debt) is paid off.
      return (p.idx + max(ceil_div(p.cur, p.limit), 1)) * p.window - now
    end
    -- The first window whose carried count leaves room (fixed_window.rs `evaluate`).
    return max((p.idx + ceil_div(p.cur + cost - p.limit, p.limit)) * p.window - now, 1)
  elseif cost > p.capacity then
    -- Never passes; asked again once the bucket is full.
    return max(ceil_div(p.deficit, p.limit), 1)
  else
    return max(ceil_div(max(p.deficit + cost * p.window - p.capacity * p.window, 0), p.limit), 1)
  end
end

-- The state's remaining units and reset time, as it stands.
local function view(p)
  if p.kind == KIND_COUNTER then
    local weighted = counter_weighted(p.prev, p.cur, now - p.idx * p.window, p.window)
    return idiv(max(p.limit * p.window - weighted, 0), p.window),
      counter_clears_in(p.prev, p.cur, p.idx, now, p.limit, p.window)
  elseif p.kind == KIND_LOG then
    local newest = 0
    for _, e in ipairs(p.entries) do
      newest = max(newest, e[1] + p.window - now)
    end
    return max(p.limit - p.used, 0), newest
  elseif p.kind == KIND_FIXED then
    return max(p.limit - p.cur, 0), fixed_clears(p)
  else
    return idiv(max(p.capacity * p.window - p.deficit, 0), p.window), ceil_div(p.deficit, p.limit)
  end
end

-- Writes back a counter, fixed window or bucket state; the log writes as it goes. A window's
-- key is kept until its debt is paid, at the slower of the plan's limit and an override's
-- (which can end unwritten).
local function store(p)
  if p.kind == KIND_COUNTER then
    local windows = max(ceil_div(p.cur, min(p.limit, p.plan_limit)), 1) + 1
    redis.call('SET', p.key, pack('<ddd', p.idx, p.cur, p.prev),
      'PX', (p.idx + windows) * p.window - now + TTL_MARGIN_MS)
  elseif p.kind == KIND_FIXED then
    local windows = max(ceil_div(p.cur, min(p.limit, p.plan_limit)), 1)
    redis.call('SET', p.key, pack('<ddd', p.idx, p.cur, 0),
      'PX', (p.idx + windows) * p.window - now + TTL_MARGIN_MS)
  elseif p.kind == KIND_BUCKET then
    -- Kept for the slower of the plan's rate and an override's (which can end unwritten).
    local from = max(now, p.updated)
    redis.call('SET', p.key, pack('<ddd', p.deficit, from, 0),
      'PX', from - now + ceil_div(p.deficit, min(p.limit, p.plan_limit)) + TTL_MARGIN_MS)
  end
end

-- Charges `k` units used at most until now + lease.
local function charge(p, k, lease, id)
  if p.kind == KIND_COUNTER or p.kind == KIND_FIXED then
    p.cur = p.cur + k
  elseif p.kind == KIND_LOG then
    local fin = now + lease
    redis.call('ZADD', p.key, fin, id)
    redis.call('HSET', p.units_key, id, int(k))
    p.entries[#p.entries + 1] = { fin, k }
    p.used = p.used + k
    local ttl = fin + p.window - now + TTL_MARGIN_MS
    if redis.call('PTTL', p.key) < ttl then
      redis.call('PEXPIRE', p.key, ttl)
      redis.call('PEXPIRE', p.units_key, ttl)
    end
  else
    p.deficit = p.deficit + k * p.window + p.limit * lease
  end
  store(p)
end

-- Gives back what block `id` leaves unused (its back_* fields; for the bucket, also the refill
-- charged ahead for the rest of its lease; for the log, the time its entry still counts).
local function give(p, id)
  local k, u, g, lease, r = p.back_granted, p.back_unused, p.back_granted_at, p.back_lease,
    p.back_rate
  -- A grant is never later than now on the ledger's clock: a give-back no charge names is
  -- stamped with the instance's clock, which may run ahead of the server's, and read as a
  -- later grant it would bring back the bucket's refill for the difference.
  g = min(g, now)
  if not (u > 0 or p.kind == KIND_LOG or p.kind == KIND_BUCKET) then
    return
  end
  if p.kind == KIND_LOG then
    local score = redis.call('ZSCORE', p.key, id)
    if score then
      local left = tonumber(redis.call('HGET', p.units_key, id) or '0') - u
      if left <= 0 then
        redis.call('ZREM', p.key, id)
        redis.call('HDEL', p.units_key, id)
      else
        redis.call('ZADD', p.key, min(tonumber(score), now), id)
        redis.call('HSET', p.units_key, id, int(left))
      end
    elseif lease == 0 and u > 0 and g + p.window > now then
      -- Units charged outside blocks, still counting, whose entry is not known (named afresh,
      -- or reset since): off the newest entries that still count and whose lease has ended;
      -- a live block's or a debt's keep theirs (untake_newest in
      -- src/store/leased/ledger/run.rs). Units charged a window ago or more count no more.
      local ended = redis.call('ZREVRANGEBYSCORE', p.key, int(now), '(' .. int(now - p.window))
      for j = 1, #ended do
        if u <= 0 then
          break
        end
        local held = tonumber(redis.call('HGET', p.units_key, ended[j]) or '0')
        local taken = min(held, u)
        if taken >= held then
          redis.call('ZREM', p.key, ended[j])
          redis.call('HDEL', p.units_key, ended[j])
        else
          redis.call('HSET', p.units_key, ended[j], int(held - taken))
        end
        u = u - taken
      end
    end
    return
  end
  load(p)
  local gidx = idiv(g, p.window)
  if p.kind == KIND_COUNTER then
    if p.stored_window == gidx then
      redis.call('SET', p.key, pack('<ddd', p.stored_window, max(p.stored_current - u, 0), p.stored_previous), 'KEEPTTL')
    elseif p.stored_window == gidx + 1 then
      redis.call('SET', p.key, pack('<ddd', p.stored_window, p.stored_current, max(p.stored_previous - u, 0)), 'KEEPTTL')
    end
  elseif p.kind == KIND_FIXED then
    if p.stored_window == gidx then
      redis.call('SET', p.key, pack('<ddd', p.stored_window, max(p.stored_current - u, 0), 0), 'KEEPTTL')
    end
  elseif p.deficit > 0 then
    -- The refill charged ahead comes back at the lower of the rate it was charged at and
    -- today's; the block's weight decays at the higher.
    local at_grant = p.limit
    if r > 0 then
      at_grant = r
    end
    local slow, fast = min(p.limit, at_grant), max(p.limit, at_grant)
    local fin = g + lease
    local back = max(min(u * p.window, k * p.window - fast * max(now - fin, 0)), 0)
      + slow * max(fin - now, 0)
    p.deficit = max(p.deficit - back, 0)
    store(p)
  end
end

-- One call: `P` its `count` policies. Returns its reply.
local function call(mode, asked, block_id, previous_block, P, count)
  local out = {}

  if mode == LEDGER_RESET then
    for i = 1, count do
      if P[i].units_key then
        redis.call('DEL', P[i].key, P[i].units_key)
      else
        redis.call('DEL', P[i].key)
      end
    end
    return pack('<dddd', 1, 0, now, 0)
  end

  if mode == LEDGER_RETURN then
    for i = 1, count do
      local p = P[i]
      give(p, block_id)
    end
    return pack('<dddd', 1, 0, now, 0)
  end

  if mode == LEDGER_KEEP then
    for i = 1, count do
      local p = P[i]
      local ttl = nil
      if p.kind == KIND_BUCKET then
        -- The refill until now at the rate in force until now (an override about to
        -- change): from now on the new rate refills, never the time before it.
        load(p)
        if p.deficit > 0 then
          store(p)
        elseif p.updated > 0 then
          redis.call('DEL', p.key)
        end
      elseif p.kind == KIND_COUNTER or p.kind == KIND_FIXED then
        -- A count past a lower limit is a debt paid at that limit per window: kept as long
        -- as `store` would keep it (a refused grant writes nothing that would).
        load(p)
        if p.cur > 0 then
          local windows = max(ceil_div(p.cur, min(p.limit, p.plan_limit)), 1)
          if p.kind == KIND_COUNTER then
            windows = windows + 1
          end
          ttl = min((p.idx + windows) * p.window - now + TTL_MARGIN_MS, MAX_USAGE_WINDOW_PRODUCT)
        end
      end
      if ttl then
        local pttl = redis.call('PTTL', p.key)
        if pttl >= 0 and pttl < ttl then
          redis.call('PEXPIRE', p.key, ttl)
        end
      end
    end
    return pack('<dddd', 1, 0, now, 0)
  end

  if mode == LEDGER_GRANT and previous_block ~= '0' then
    for i = 1, count do
      give(P[i], previous_block)
    end
  end

  for i = 1, count do
    load(P[i])
  end

  -- Force: in full, as the exact algorithms' overcharge (ledger.rs `force`): a debt paid at
  -- the limit's rate, saturating at MAX_USAGE_WINDOW_PRODUCT / W units.
  if mode == LEDGER_FORCE then
    for i = 1, count do
      local p = P[i]
      if p.cost > 0 then
        if p.kind == KIND_BUCKET then
          p.deficit = min(p.deficit + p.cost * p.window, max(p.deficit, MAX_USAGE_WINDOW_PRODUCT))
          store(p)
        elseif p.kind == KIND_LOG then
          -- One entry dated ahead, counting until the windows its units used up have passed
          -- (debt_entry in sliding_window_log.rs).
          local total = min(p.used + p.cost, max(p.used, idiv(MAX_USAGE_WINDOW_PRODUCT, p.window)))
          local extra = total - p.used
          if extra > 0 then
            charge(p, extra, (ceil_div(total, p.limit) - 1) * p.window, block_id)
          end
        else
          p.cur = min(p.cur + p.cost, max(p.cur, idiv(MAX_USAGE_WINDOW_PRODUCT, p.window)))
          store(p)
        end
      end
    end
    -- Allowed: the key is within its limits afterwards. When a debt stands, the caller gives
    -- back the block it holds, charged before the debt.
    local clear = 1
    for i = 1, count do
      if most(P[i], 0) < 0 then
        clear = 0
      end
    end
    return pack('<dddd', clear, 0, now, 0)
  end

  -- Grant (or peek): a block lent for `asked` ms when every policy has room for at least
  -- its cost, else one exact request, else a refusal.
  local lease, granted = -1, {}
  if mode == LEDGER_GRANT and asked > 0 then
    local all = true
    for i = 1, count do
      if most(P[i], asked) < P[i].cost then
        all = false
      end
    end
    if all then
      lease = asked
      for i = 1, count do
        local p = P[i]
        granted[i] = max(min(p.wanted, most(p, asked)), p.cost)
        if p.kind == KIND_COUNTER or p.kind == KIND_FIXED then
          lease = min(lease, (p.idx + 1) * p.window - now)
        end
      end
    end
  end
  if lease < 0 then
    local all = true
    for i = 1, count do
      if most(P[i], 0) < P[i].cost then
        all = false
      end
    end
    if all then
      lease = 0
      for i = 1, count do
        granted[i] = P[i].cost
      end
    end
  end

  if lease < 0 then
    out[1] = pack('<dddd', 0, 0, now, count)
    for i = 1, count do
      local p = P[i]
      local remaining, reset = view(p)
      local r = 0
      if most(p, 0) < p.cost then
        r = retry(p, p.cost)
      end
      out[#out + 1] = pack('<dddddd', 0, remaining, reset, r, p.limit, p.capacity)
    end
    return table.concat(out)
  end

  out[1] = pack('<dddd', 1, lease, now, count)
  for i = 1, count do
    local p = P[i]
    if mode == LEDGER_GRANT then
      charge(p, granted[i], lease, block_id)
    elseif p.kind == KIND_LOG then
      p.used = p.used + granted[i]
      -- An entry of nothing would count for a whole window (run.rs adds none either).
      if granted[i] > 0 then
        p.entries[#p.entries + 1] = { now, granted[i] }
      end
    elseif p.kind == KIND_BUCKET then
      p.deficit = p.deficit + granted[i] * p.window
    else
      p.cur = p.cur + granted[i]
    end
    local remaining, reset = view(p)
    out[#out + 1] = pack('<dddddd', granted[i], remaining, reset, 0, p.limit, p.capacity)
  end
  return table.concat(out)
end

if ARGV[1] ~= LEDGER_BATCH then
  local P, count = policies(ARGV[6], 0)
  return call(ARGV[1], tonumber(ARGV[3]), ARGV[4], ARGV[5], P, count)
end
local replies, o, k = {}, 3, 0
for j = 1, tonumber(ARGV[3]) do
  local reply = quick(ARGV[o + 1], tonumber(ARGV[o + 2]), ARGV[o + 4], ARGV[o + 5], KEYS[k + 1],
    KEYS[k + 2])
  if reply then
    k = k + 2
  else
    local P, count
    P, count, k = policies(ARGV[o + 5], k)
    reply = call(ARGV[o + 1], tonumber(ARGV[o + 2]), ARGV[o + 3], ARGV[o + 4], P, count)
  end
  replies[j] = reply
  o = o + 5
end
return table.concat(replies)
