-- tollgate: what the decision script and the lease ledger share before their own text:
-- globals kept local, and integer arithmetic on doubles. Every value is an integer below
-- 2^53, so doubles are exact; divisions are floored with a correction step instead of
-- trusting a / b near 2^53.
-- Globals are looked up by name at every use; the scripts run often enough to keep them local.
local floor, max, min, tonumber, format = math.floor, math.max, math.min, tonumber, string.format
local pack, unpack_struct, unpack = struct.pack, struct.unpack, unpack

-- floor(a / b) for integers a >= 0, b >= 1.
local function idiv(a, b)
  local q = floor(a / b)
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
  return format('%.0f', x)
end
