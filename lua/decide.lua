-- tollgate: decides one request against every policy given, all or nothing.
--
-- KEYS[i]: the state key of policy i, all under one hash tag.
-- ARGV[1]: now in ms, or "" to read the server clock (TIME).
-- ARGV[2]: "1" to charge an allowed request, "0" to only evaluate (peek).
-- ARGV[3 + 6(i-1) ...]: policy i's algorithm id, limit, window ms, capacity, max delay ms, cost.
--
-- Every policy is evaluated first; only if every one allows is any of them charged.
-- When one denies, the others report an evaluation at cost 0 (nothing was charged).
-- Returns { allowed, then per policy: allowed, remaining, reset_after, retry_after, delay }.
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local charge = ARGV[2] == '1'

local out, ps, states = { 1 }, {}, {}
local all = true
for i = 1, #KEYS do
  local b = 3 + (i - 1) * 6
  local p = {
    alg = tonumber(ARGV[b]),
    limit = tonumber(ARGV[b + 1]),
    window = tonumber(ARGV[b + 2]),
    capacity = tonumber(ARGV[b + 3]),
    max_delay = tonumber(ARGV[b + 4]),
    cost = tonumber(ARGV[b + 5]),
  }
  local a = ALG[p.alg]
  if not a then
    return redis.error_reply('tollgate: unknown algorithm ' .. tostring(ARGV[b]))
  end
  local s = a.load(KEYS[i], now, p)
  local ok, remaining, reset_after, retry_after, delay = a.evaluate(s, now, p, p.cost)
  if not ok then
    all = false
  end
  local o = 1 + (i - 1) * 5
  out[o + 1] = ok and 1 or 0
  out[o + 2] = remaining
  out[o + 3] = reset_after
  out[o + 4] = retry_after
  out[o + 5] = delay
  ps[i], states[i] = p, s
end

if not all and #KEYS > 1 then
  -- Nothing is charged: the policies that would have allowed report their state as it
  -- stands (an evaluation at cost 0), so their headers do not count this request.
  for i = 1, #KEYS do
    local o = 1 + (i - 1) * 5
    if out[o + 1] == 1 then
      local p = ps[i]
      local _, remaining, reset_after, retry_after, delay = ALG[p.alg].evaluate(states[i], now, p, 0)
      out[o + 2] = remaining
      out[o + 3] = reset_after
      out[o + 4] = retry_after
      out[o + 5] = delay
    end
  end
end

if all and charge then
  local committed = {}
  for i = 1, #KEYS do
    local p, key = ps[i], KEYS[i]
    local a = ALG[p.alg]
    local s = states[i]
    if committed[key] then
      -- The same state named twice: charge on top of the first charge.
      s = a.load(key, now, p)
    end
    a.commit(key, s, now, p, p.cost)
    committed[key] = true
  end
end
out[1] = all and 1 or 0
return out
