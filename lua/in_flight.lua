-- In flight: one sorted set per (key, policy) of the slots held. Member = the slot id the
-- client chose for the request (a whole number), score = when it expires (ms). The
-- arithmetic is src/algorithm/in_flight.rs; the "cost" a request sends for this policy is its
-- slot id (0: no slot asked, only a look), because a request always takes exactly one slot.
-- Slots that have expired (their holder crashed) are dropped when the set is read.
ALG[ALG_IN_FLIGHT] = function()
  local inf = { zset = true }

  function inf.load(key, now, p)
    local ok = redis.pcall('ZREMRANGEBYSCORE', key, '-inf', now)
    if type(ok) == 'table' and ok.err then
      return nil, ok.err
    end
    return { key = key, held = redis.call('ZCARD', key), add = {}, drop = {}, keep = {} }
  end

  function inf.evaluate(s, now, p, slot, charge)
    local n = p.limit
    local asked = 0
    if slot ~= 0 then
      asked = 1
    end
    local allowed = s.held + asked <= n
    local after = s.held
    if allowed then
      after = s.held + asked
      if charge and asked == 1 then
        inf.commit(s, now, p, slot)
      end
    end
    local retry_after = 0
    if not allowed then
      retry_after = IN_FLIGHT_RETRY_AFTER_MS
    end
    return allowed, max(n - after, 0), 0, retry_after, 0
  end

  function inf.commit(s, now, p, slot)
    if slot ~= 0 then
      s.held = s.held + 1
      s.add[#s.add + 1] = slot
    end
  end

  -- Gives the slot back if it is held; true when the state changed. A slot not in the set
  -- (it expired, a reset forgot it, or it was given back already) frees nothing, not
  -- even for the rest of a batch.
  function inf.refund(s, now, p, slot)
    if slot == 0 then
      return false
    end
    for i = 1, #s.add do
      if s.add[i] == slot then
        table.remove(s.add, i)
        s.held = max(s.held - 1, 0)
        return true
      end
    end
    for i = 1, #s.drop do
      if s.drop[i] == slot then
        return false
      end
    end
    if not redis.call('ZSCORE', s.key, int(slot)) then
      return false
    end
    s.drop[#s.drop + 1] = slot
    s.held = max(s.held - 1, 0)
    return true
  end

  -- Pushes back the slot's expiry (it exists: a slot already gone is not brought back).
  function inf.refresh(s, now, p, slot)
    if slot == 0 then
      return false
    end
    s.keep[#s.keep + 1] = slot
    return true
  end

  function inf.overcharge(s, now, p, extra)
    return false
  end

  function inf.store(key, s, now, p)
    local expiry = now + p.window
    for i = 1, #s.drop do
      redis.call('ZREM', key, int(s.drop[i]))
    end
    for i = 1, #s.keep do
      redis.call('ZADD', key, 'XX', expiry, int(s.keep[i]))
    end
    for i = 1, #s.add do
      redis.call('ZADD', key, expiry, int(s.add[i]))
    end
    -- The set lives as long as its longest slot: a slot taken or refreshed under a shorter
    -- lease (a reload, another instance's plan) must not cut the others' time short.
    if #s.add > 0 or #s.keep > 0 then
      local want = ttl(expiry, now)
      local left = redis.call('PTTL', key)
      if left < 0 or left < want then
        redis.call('PEXPIRE', key, want)
      end
    end
  end

  return inf
end
