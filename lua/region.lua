-- tollgate: a region's deposits (src/store/regions/ reads and writes them).
--
-- A deposit is a block of one policy's units that the region took from the home ledger, kept
-- in the region's Redis for the region's instances to take from: what is left of it, until
-- when it may be lent (on this Redis's clock), and the home block it is (to give it back).
-- Every unit an instance of the region admits comes out of a deposit, within its lease: so
-- the home ledger's accounting, which charged the block for its whole lease, covers it.
--
-- KEYS: one deposit per policy (<prefix>:{<key>}:<policy>:region-<kind>).
-- The upper-case names are the constants shared with Rust (lua/constants.lua), written in
-- when the script is assembled.
-- ARGV: mode (REGION_TAKE …, below), now ('' reads TIME), then per mode:
--   take: the lease asked (ms; 0: the request's cost only, no block), how long a refill
--       is left to the caller that starts it (ms), then a binary string of five doubles per
--       policy: cost, wanted (the most units the caller's block may hold), the units of the
--       caller's previous block given back first, when that block was taken (this Redis's
--       ms), and 1 when the deposit is renewed as its time runs out (token bucket, GCRA, the
--       log), 0 when only as its units run out (the windows, whose leases end at the window
--       boundary anyway).
--   install: a binary string of the deposit's doubles per policy, the new deposit; when
--       the renewal that brings it began (this Redis's ms).
--   give back: two doubles per policy: the unused units of a block, when it was taken.
--   deny: one double per policy: until when the home refused (ms): until then a request
--       that does not fit what is left is refused here, without asking the home.
--   drain: every deposit is emptied, keeping the drain's time; '1' (a debt) sets it aside
--       to go home (see retire), '' (a reset) drops it and those set aside before.
--   end: one double per policy, a block id: the deposit is removed if it is that block
--       and its lease has ended (its unused units then go home).
--   retire: two doubles per policy, a block id and when it was installed: that deposit,
--       set aside (replaced by a renewal, or drained for a debt), leaves the key to go home
--       (its last block has ended).
-- Reply: binary little-endian doubles.
--   take: allowed, lease, now, status (0 nothing to do, 1 the caller renews the deposit in
--       the background, 2 the caller renews it now (nothing fits), 3 the home refused (see
--       denied_until), 4 nothing fits and another caller renews), then per policy the units
--       granted, the units of the previous block taken back, and the deposit after the call.
--   install: now, 1 when installed (0: drained since the renewal began, or it took
--       DRAIN_MARK_MS), then per policy the deposit before the call (zeros when none).
--   drain, end: now, then per policy the deposit before the call (zeros when there was
--       none, or, for end, when it was not removed).
--   retire: now, then per policy 1 (found), 0 (dropped by a reset since) or 2 (gone
--       otherwise: trimmed or expired), and the deposit (zeros when not found).
--   give back: now, then per policy the units taken back.
--   deny: now.
-- A deposit: left, ends, installed, block, granted, granted_at, lease, rate, taken,
-- lent_until, refill_until, denied_until, limit, capacity, home_remaining, reset_at,
-- drained_at.
-- `granted_at` is the home's clock; every other time is this Redis's.
local floor, max, min, tonumber = math.floor, math.max, math.min, tonumber
local pack, unpack_struct, unpack = struct.pack, struct.unpack, unpack
local FIELDS = DEPOSIT_BYTES / 8
local DEPOSIT = '<' .. string.rep('d', FIELDS)
local SLACK_MS = 2

local mode = ARGV[1]
local now
if ARGV[2] ~= '' then
  now = tonumber(ARGV[2])
else
  local t = redis.call('TIME')
  -- Converted by the arithmetic, once each (see single.lua).
  now = t[1] * 1000 + floor(t[2] / 1000)
end

-- Per key, the deposits set aside (replaced by a renewal, drained for a debt) that have yet
-- to go home (see retire): kept in the key's value after its deposit, so that a block lent
-- from one and given back after it was set aside still reaches the home through it.
local retired = {}
-- At most this many, and none longer than this after its last block ended: the home call
-- that retires one comes within milliseconds, unless its process is gone.
local MAX_RETIRED, RETIRED_MS = 8, 10000
-- How long the time of a drain is kept (ms): a renewal that began before a drain is refused
-- at its install, and so is one that took this long (no drain before it can be ruled out).
local DRAIN_MARK_MS = 60000

local function load(key)
  local v = redis.call('GET', key)
  retired[key] = {}
  if v and #v >= DEPOSIT_BYTES and #v % DEPOSIT_BYTES == 0 then
    for at = DEPOSIT_BYTES + 1, #v, DEPOSIT_BYTES do
      local r = retired[key]
      r[#r + 1] = { unpack_struct(DEPOSIT, v, at) }
    end
    return { unpack_struct(DEPOSIT, v) }
  end
  return nil
end

local function empty()
  local d = {}
  for i = 1, FIELDS do
    d[i] = 0
  end
  return d
end

local function out(d)
  return pack(DEPOSIT, unpack(d, 1, FIELDS))
end

local function save(key, d)
  local last = max(d[2], d[10], d[11], d[12])
  if d[17] > 0 then
    last = max(last, d[17] + DRAIN_MARK_MS)
  end
  local parts, kept = { out(d) }, {}
  for _, r in ipairs(retired[key] or {}) do
    if max(r[2], r[10]) + RETIRED_MS > now then
      kept[#kept + 1] = r
    end
  end
  for j = max(#kept - MAX_RETIRED + 1, 1), #kept do
    last = max(last, kept[j][2], kept[j][10] + RETIRED_MS)
    parts[#parts + 1] = out(kept[j])
  end
  redis.call('SET', key, table.concat(parts), 'PX', max(last - now, 0) + 5000)
end

-- An empty deposit that keeps when the key's deposits were last drained (for the renewals
-- under way then, see install) and the deposits still to go home.
local function leave_empty(key, drained_at)
  local mark = empty()
  mark[17] = drained_at
  save(key, mark)
end

-- Gives `back` unused units of a block taken at `back_at` to the deposit it came from: the
-- key's deposit `d` if it holds a block installed before then (even if it has ended: its
-- units go home at its end, and a take lends nothing from an ended deposit), otherwise the
-- latest one set aside before then that has yet to go home. Returns the units taken back.
local function take_back(key, d, back, back_at)
  if back <= 0 then
    return 0
  end
  local from = nil
  if d[4] ~= 0 and back_at > d[3] then
    from = d
  else
    for _, r in ipairs(retired[key]) do
      if r[3] < back_at and (from == nil or r[3] > from[3]) then
        from = r
      end
    end
  end
  if from == nil then
    return 0
  end
  local was = from[1]
  from[1] = min(from[1] + back, from[5])
  from[9] = max(from[9] - back, 0)
  return from[1] - was
end

local n = #KEYS

if mode == REGION_TAKE then
  local lease, lock_ms, blob = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
  local ds, asks, kept = {}, {}, {}
  local fits, denied, locked, given = true, false, false, false
  local room = lease
  for i = 1, n do
    local cost, wanted, back, back_at, timed = unpack_struct('<ddddd', blob, (i - 1) * REGION_ASK_BYTES + 1)
    local d = load(KEYS[i]) or empty()
    kept[i] = take_back(KEYS[i], d, back, back_at)
    if kept[i] > 0 then
      given = true
    end
    ds[i] = d
    asks[i] = { cost, wanted, timed }
    local live = d[2] - now > SLACK_MS
    if not live or d[1] < cost then
      fits = false
    elseif lease > 0 then
      room = min(room, d[2] - now - SLACK_MS)
    end
    if d[12] > now then
      denied = true
    end
    if d[11] > now then
      locked = true
    end
  end
  local allowed, status, granted = 0, 0, {}
  if fits then
    allowed = 1
    local renew = false
    for i = 1, n do
      local d, cost, wanted = ds[i], asks[i][1], asks[i][2]
      -- A block holds at most half the deposit, so one instance cannot empty it for the
      -- region's others.
      local g = cost
      if lease > 0 then
        g = max(min(wanted, d[1], max(floor(d[5] / 2), 1)), cost)
      end
      granted[i] = g
      d[1] = d[1] - g
      d[9] = d[9] + g
      d[10] = max(d[10], now + room)
      if d[1] * 2 < d[5] or (asks[i][3] == 1 and (d[2] - now) * 2 < d[7]) then
        renew = true
      end
    end
    if lease == 0 then
      room = 0
    end
    if renew and not locked and not denied then
      status = 1
    end
  else
    room = 0
    if denied then
      status = 3
    elseif locked then
      status = 4
    else
      status = 2
    end
  end
  if status == 1 or status == 2 then
    for i = 1, n do
      ds[i][11] = now + lock_ms
    end
  end
  local reply = { pack('<dddd', allowed, room, now, status) }
  for i = 1, n do
    if allowed == 1 or given or status == 1 or status == 2 then
      save(KEYS[i], ds[i])
    end
    reply[#reply + 1] = pack('<dd', granted[i] or 0, kept[i])
    reply[#reply + 1] = out(ds[i])
  end
  return table.concat(reply)
elseif mode == REGION_INSTALL then
  -- A renewal that began (ARGV[4]) no later than the key's last drain (a reset, a debt) is
  -- not installed: its block was granted against a count the reset erased, or before the
  -- debt. Otherwise the drain's time is carried into the new deposit.
  local started = tonumber(ARGV[4])
  local olds, stale = {}, false
  for i = 1, n do
    olds[i] = load(KEYS[i]) or empty()
    if olds[i][17] >= started or now - started >= DRAIN_MARK_MS then
      stale = true
    end
  end
  local reply = { pack('<dd', now, stale and 0 or 1) }
  for i = 1, n do
    reply[#reply + 1] = out(olds[i])
    if not stale then
      local d = { unpack_struct(DEPOSIT, ARGV[3], (i - 1) * DEPOSIT_BYTES + 1) }
      d[3], d[9], d[10], d[11], d[12], d[17] = now, 0, now, 0, 0, olds[i][17]
      -- The deposit replaced goes home once its last block ends (retire).
      if olds[i][4] ~= 0 and olds[i][5] > 0 then
        local r = retired[KEYS[i]]
        r[#r + 1] = olds[i]
      end
      save(KEYS[i], d)
    end
  end
  return table.concat(reply)
elseif mode == REGION_DRAIN then
  -- What is left is an empty deposit that keeps the drain's time, for the renewals under
  -- way (see install).
  local keep = ARGV[3] == '1'
  local reply = { pack('<d', now) }
  for i = 1, n do
    local d = load(KEYS[i]) or empty()
    reply[#reply + 1] = out(d)
    if keep then
      -- A debt: the deposit is set aside, to go home with what its blocks give back.
      if d[4] ~= 0 and d[5] > 0 then
        local r = retired[KEYS[i]]
        r[#r + 1] = d
      end
    else
      -- A reset: nothing charged before it goes home after it (it would come off the count
      -- that started afresh), so the deposits set aside are dropped too.
      retired[KEYS[i]] = {}
    end
    leave_empty(KEYS[i], now)
  end
  return table.concat(reply)
elseif mode == REGION_END then
  -- A deposit whose lease has ended is removed, if it is still the block named.
  local reply = { pack('<d', now) }
  for i = 1, n do
    local block = unpack_struct('<d', ARGV[3], (i - 1) * 8 + 1)
    local d = load(KEYS[i])
    if d and d[4] == block and d[2] <= now then
      if d[17] > 0 or #retired[KEYS[i]] > 0 then
        leave_empty(KEYS[i], d[17])
      else
        redis.call('DEL', KEYS[i])
      end
      reply[#reply + 1] = out(d)
    else
      reply[#reply + 1] = out(empty())
    end
  end
  return table.concat(reply)
elseif mode == REGION_GIVE_BACK then
  local reply = { pack('<d', now) }
  for i = 1, n do
    local back, back_at = unpack_struct('<dd', ARGV[3], (i - 1) * 2 * 8 + 1)
    local d = load(KEYS[i])
    local kept = 0
    if d then
      kept = take_back(KEYS[i], d, back, back_at)
      if kept > 0 then
        save(KEYS[i], d)
      end
    end
    reply[#reply + 1] = pack('<d', kept)
  end
  return table.concat(reply)
elseif mode == REGION_RETIRE then
  -- A replaced deposit whose last block has ended leaves, to go home: the one of each
  -- policy named by its block and when it was installed (two doubles per policy).
  local reply = { pack('<d', now) }
  for i = 1, n do
    local block, installed = unpack_struct('<dd', ARGV[3], (i - 1) * 2 * 8 + 1)
    local d = load(KEYS[i])
    local found, status = nil, 2
    if d and d[17] >= installed then
      status = 0
    end
    if d then
      local rs = retired[KEYS[i]]
      for j = #rs, 1, -1 do
        if rs[j][4] == block and rs[j][3] == installed then
          found = table.remove(rs, j)
          break
        end
      end
      if found then
        status = 1
        save(KEYS[i], d)
      end
    end
    reply[#reply + 1] = pack('<d', status)
    reply[#reply + 1] = out(found or empty())
  end
  return table.concat(reply)
elseif mode == REGION_DENY then
  for i = 1, n do
    local until_ms = unpack_struct('<d', ARGV[3], (i - 1) * 8 + 1)
    local d = load(KEYS[i]) or empty()
    d[12], d[11] = max(d[12], until_ms), 0
    save(KEYS[i], d)
  end
  return pack('<d', now)
end
return redis.error_reply('tollgate region script: unknown mode ' .. tostring(mode))
