-- tollgate: decides a batch of requests, in order, each against every policy it names, all
-- or nothing per request. A batch of one is a plain decision. A request may also be a
-- refund, which gives units back instead of deciding.
--
-- KEYS[i]: state i (one per distinct (key, policy)), then KEYS[nk + i]: its per-key override
-- (a string of two little-endian doubles: limit and capacity), if one is set; in a cluster
-- all share one hash slot.
-- ARGV[1]: now in ms, or "" to read the server clock (TIME); one instant for the batch
-- (read in single.lua, which runs first and answers the common call of one request).
-- Then three binary strings (little-endian; struct.unpack reads them much faster than
-- tonumber parses decimal text), or, for one policy and one state, the three one after the
-- other as one string (ARGV[2] alone; see single.lua): per policy its algorithm id, limit,
-- window ms, capacity and max delay ms (f64 each, PARAMS_BYTES); per state the index of its
-- policy (u32, STATE_BYTES); per request its mode (u8: MODE_CHARGE to charge an allowed
-- request, MODE_PEEK to only evaluate, MODE_REFUND to give back up to each cost to its
-- state, MODE_SETTLE to charge a cost of 0 or more whether or not it fits (within each
-- algorithm's bound) and refund a negative one, MODE_REFRESH to push back the expiry of
-- in-flight slots; the modes that decide are below MODE_REFUND), the number of policies m
-- (u32, at least 1), and m pairs of state index (u32) and cost (f64). For an in-flight
-- policy the cost is the request's slot id (0: no slot).
--
-- Each state is read once and written once, however many requests of the batch touch it.
-- Within a request every policy is evaluated first; only if every one allows is any of them
-- charged. When one denies, the others report an evaluation at cost 0 (nothing was charged).
-- A refund, settlement or refresh answers like a request whose policies are evaluated at
-- cost 0 after it.
-- Returns one binary string (little-endian), per request: allowed (i8, 1 or 0) then per
-- policy allowed (i8), remaining, reset_after, retry_after and delay (f64 each) — for a
-- state with a per-key override, allowed + 2 and then its capacity (f64) too; or -1 (i8),
-- a length (u32) and a message when a state the request names cannot be read (the key holds
-- a value of another type), while the other requests of the batch are decided as usual.
-- One string costs Redis less to send, and the client far less to parse, than an array of
-- six integers per request.
-- `now` is read first, in single.lua, for this path and the common call alike.
local params, state_policies, requests = ARGV[2], ARGV[3], ARGV[4]
if #ARGV == 2 then
  local one = ARGV[2]
  params, state_policies, requests = one:sub(1, PARAMS_BYTES),
    one:sub(PARAMS_BYTES + 1, PARAMS_BYTES + STATE_BYTES), one:sub(PARAMS_BYTES + STATE_BYTES + 1)
end
local np = #params / PARAMS_BYTES
local policies, built = {}, {}
for k = 1, np do
  local id, limit, window, capacity, max_delay = unpack_struct('<ddddd', params, PARAMS_BYTES * (k - 1) + 1)
  local a = built[id]
  if not a then
    if not ALG[id] then
      return redis.error_reply('tollgate: unknown algorithm ' .. tostring(id))
    end
    a = ALG[id]()
    built[id] = a
  end
  policies[k] = { a = a, limit = limit, window = window, capacity = capacity, max_delay = max_delay }
end

local nk = #KEYS / 2
-- P: each state's policy; S: the state; E: why it cannot be read; X: when the state as read
-- expires (its key's TTL was set from it), and K: no later than that whatever policy it was
-- written under (an algorithm's `kept_since`, where its expiry depends on the limit, which
-- an override changes), to keep that TTL when a write leaves it in the same cell of the
-- grid (the expiry and keep rules in prelude.lua).
local P, S, E, X, K = {}, {}, {}, {}, {}
if #state_policies ~= STATE_BYTES * nk then
  return redis.error_reply('tollgate: ' .. nk .. ' keys but ' .. #state_policies .. ' bytes of state policies')
end
-- A batch of one policy (what the store coalesces most) names policy 1 for every state: one
-- comparison instead of reading each index.
if np == 1 and state_policies == string.rep('\1\0\0\0', nk) then
  local p = policies[1]
  for i = 1, nk do
    P[i] = p
  end
else
  for i = 1, nk do
    P[i] = policies[unpack_struct('<I4', state_policies, STATE_BYTES * (i - 1) + 1)]
  end
end
local zsets = false
for k = 1, np do
  if policies[k].a.zset then
    zsets = true
  end
end
-- One MGET reads every string state and every override; a state with an override decides
-- with a copy of its policy that has the override's limit and capacity. string_index[j]: the
-- state of the MGET's j-th value (j itself when every state is a string).
local values, ns, string_index
if zsets then
  local names = {}
  string_index = {}
  for i = 1, nk do
    if not P[i].a.zset then
      ns = #names + 1
      names[ns] = KEYS[i]
      string_index[ns] = i
    end
  end
  ns = #names
  for i = 1, nk do
    names[ns + i] = KEYS[nk + i]
  end
  values = redis.call('MGET', unpack(names))
else
  -- KEYS is the list to read already: the states, then their overrides.
  ns = nk
  values = redis.call('MGET', unpack(KEYS))
end
for i = 1, nk do
  local v = values[ns + i]
  if v and #v == 16 then
    local limit, capacity = unpack_struct('<dd', v)
    local p = P[i]
    -- `slowest`: the lower of the plan's limit and the override's, which a token bucket's
    -- expiry follows (the override can end with no write to move the key's TTL).
    P[i] = { a = p.a, limit = limit, window = p.window, capacity = capacity, max_delay = p.max_delay, overridden = true, slowest = min(limit, p.limit) }
  end
end
if zsets then
  for i = 1, nk do
    local p = P[i]
    if p.a.zset then
      S[i], E[i] = p.a.load(KEYS[i], now, p)
    end
  end
end

if ns > 0 then
  -- MGET answers nil both for a missing key and for a key of another type; the second must
  -- be an error, not a fresh state (writing would destroy somebody else's value).
  local missing = {}
  for j = 1, ns do
    local i, v = j, values[j]
    if string_index then
      i = string_index[j]
    end
    local p = P[i]
    local a = p.a
    if v then
      -- `decode` of `packed` in prelude.lua, inline.
      if #v == a.size or #v == a.size + 1 then
        local s = { unpack_struct(a.layout, v) }
        S[i] = s
        local x = a.expires_at(s, p)
        X[i] = x
        K[i] = a.kept_since and a.kept_since(s, p) or x
      else
        E[i] = 'tollgate: unreadable state at ' .. KEYS[i]
      end
    else
      S[i] = a.fresh()
      missing[#missing + 1] = i
    end
  end
  if #missing > 0 then
    local names = {}
    for j = 1, #missing do
      names[j] = KEYS[missing[j]]
    end
    if redis.call('EXISTS', unpack(names)) > 0 then
      for j = 1, #missing do
        if redis.call('EXISTS', names[j]) == 1 then
          E[missing[j]] = 'tollgate: ' .. names[j] .. ' holds a value of another type'
        end
      end
    end
  end
end

-- replies: the packed answer of each request, in order (r of them); out: one request's
-- per-policy answers while several policies are decided.
local replies, r, out, dirty = {}, 0, {}, {}
local idx, costs = {}, {}
local pos, last = 1, #requests
while pos <= last do
  -- Every request names at least one policy, so its header and first pair can be read in
  -- one go; a request of several policies then reads its pairs from the first.
  local mode, m, i, cost, after = unpack_struct('<BI4I4d', requests, pos)
  local charge = mode == MODE_CHARGE
  if m == 1 and mode <= MODE_CHARGE then
    -- The common request: one policy.
    pos = after
    if E[i] then
      replies[r + 1], replies[r + 2] = pack('<bI4', -1, #E[i]), E[i]
      r = r + 2
    else
      local p, s = P[i], S[i]
      -- Evaluated and, when allowed and charged, committed in one pass.
      local ok, remaining, reset_after, retry_after, delay = p.a.evaluate(s, now, p, cost, charge)
      local allowed = 0
      if ok then
        allowed = 1
        if charge then
          dirty[i] = true
        end
      end
      r = r + 1
      if p.overridden and p.max_delay > 0 then
        -- A shaping policy's override sends its limit too: what the longest wait admits.
        replies[r] = pack('<bbdddddd', allowed, allowed + 2, remaining, reset_after, retry_after, delay, p.capacity, p.limit)
      elseif p.overridden then
        replies[r] = pack('<bbddddd', allowed, allowed + 2, remaining, reset_after, retry_after, delay, p.capacity)
      else
        replies[r] = pack('<bbdddd', allowed, allowed, remaining, reset_after, retry_after, delay)
      end
    end
  else
    local err
    pos = pos + REQUEST_HEAD_BYTES
    for j = 1, m do
      i, cost, pos = unpack_struct('<I4d', requests, pos)
      idx[j], costs[j] = i, cost
      err = err or E[i]
    end
    if err then
      replies[r + 1], replies[r + 2] = pack('<bI4', -1, #err), err
      r = r + 2
    else
      if mode >= MODE_REFUND then
        -- A refund, settlement or refresh, then the states as it left them (an evaluation
        -- at cost 0). A state named twice gets both, the second after the first.
        for j = 1, m do
          local i = idx[j]
          local a, c, changed = P[i].a, costs[j], false
          -- Nothing given back or charged changes nothing: a state seen from a later
          -- window is not moved to it (the Rust stores leave it as it is too).
          if mode == MODE_REFUND then
            changed = c > 0 and a.refund(S[i], now, P[i], c)
          elseif mode == MODE_SETTLE and c < 0 then
            changed = a.refund(S[i], now, P[i], -c)
          elseif mode == MODE_SETTLE then
            changed = c > 0 and a.overcharge(S[i], now, P[i], c)
          elseif a.refresh then
            changed = a.refresh(S[i], now, P[i], c)
          end
          if changed then
            dirty[i] = true
          end
          costs[j] = 0
        end
      end
      local all, base = true, 0
      for j = 1, m do
        local i = idx[j]
        local p = P[i]
        local ok, remaining, reset_after, retry_after, delay = p.a.evaluate(S[i], now, p, costs[j])
        if not ok then
          all = false
        end
        local o = base + (j - 1) * 5
        out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] =
          ok and 1 or 0, remaining, reset_after, retry_after, delay
      end
      if not all then
        -- Nothing is charged: the policies that would have allowed report their state as
        -- it stands (an evaluation at cost 0), so their headers do not count this request.
        for j = 1, m do
          local o = base + (j - 1) * 5
          if out[o + 1] == 1 then
            local i = idx[j]
            local p = P[i]
            local _, remaining, reset_after, retry_after, delay = p.a.evaluate(S[i], now, p, 0)
            out[o + 2], out[o + 3], out[o + 4], out[o + 5] = remaining, reset_after, retry_after, delay
          end
        end
      elseif charge then
        -- A state named twice is charged twice, the second on top of the first.
        for j = 1, m do
          local i = idx[j]
          P[i].a.commit(S[i], now, P[i], costs[j])
          dirty[i] = true
        end
      end
      r = r + 1
      replies[r] = pack('<b', all and 1 or 0)
      for j = 1, m do
        local o = (j - 1) * 5
        local p = P[idx[j]]
        r = r + 1
        if p.overridden and p.max_delay > 0 then
          replies[r] = pack('<bdddddd', out[o + 1] + 2, out[o + 2], out[o + 3], out[o + 4], out[o + 5], p.capacity, p.limit)
        elseif p.overridden then
          replies[r] = pack('<bddddd', out[o + 1] + 2, out[o + 2], out[o + 3], out[o + 4], out[o + 5], p.capacity)
        else
          replies[r] = pack('<bdddd', out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5])
        end
      end
    end
  end
end

for i = 1, nk do
  if dirty[i] then
    local p = P[i]
    local a, s = p.a, S[i]
    if a.zset then
      a.store(KEYS[i], s, now, p)
    else
      -- Both bounds of the key's TTL hold when the state as read was in the same cell as
      -- the new one: K for the lower bound, X for the upper one (a refund moves the expiry
      -- back; a charge, all single.lua sees, never does). The expiry and keep rules of
      -- prelude.lua (both K and X are set or neither) and the state's encoding, inline: a
      -- function call costs more than their arithmetic.
      local t = a.expires_at(s, p)
      if t < now then
        t = now
      end
      t = t + TTL_MARGIN_MS
      local target = t + (-t) % TTL_GRID_MS
      local k, x = K[i], X[i]
      local low = target - TTL_GRID_MS
      -- Marked when no override is in force (the override mark in prelude.lua): the MGET
      -- above read every state's override.
      local value
      if p.overridden then
        value = pack(a.layout, unpack(s, 1, a.fields))
      else
        s[a.fields + 1] = NO_OVERRIDE_MARK
        value = pack(a.marked, unpack(s, 1, a.fields + 1))
      end
      if k and k + TTL_MARGIN_MS <= target and k + TTL_MARGIN_MS > low and x + TTL_MARGIN_MS <= target and x + TTL_MARGIN_MS > low then
        redis.call('SET', KEYS[i], value, 'KEEPTTL')
      else
        redis.call('SET', KEYS[i], value, 'PX', target - now)
      end
    end
  end
end
return table.concat(replies)
