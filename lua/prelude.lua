-- tollgate: shared helpers. Every value is an integer below 2^53, so doubles are exact;
-- divisions are floored with a correction step instead of trusting a / b near 2^53.
local ALG = {}

-- Kept past expires_at, in ms, so a key never vanishes while its state still matters.
local TTL_MARGIN_MS = 1000

-- floor(a / b) for integers a >= 0, b >= 1.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- ceil(a / b) for integers a >= 0, b >= 1.
local function ceil_div(a, b)
  local q = idiv(a, b)
  if a - q * b > 0 then
    return q + 1
  end
  return q
end

-- An integer as a decimal string, never in exponent form.
local function int(x)
  return string.format('%.0f', x)
end

-- Keeps a key until `expires_at` (ms, on the decision's clock) has passed, plus a margin.
local function expire_at(key, expires_at, now)
  redis.call('PEXPIRE', key, int(math.max(expires_at - now, 0) + TTL_MARGIN_MS))
end
