-- tollgate: the decision script's helpers (after integers.lua: idiv, ceil_div, int).
-- ALG[id] builds algorithm id's functions; a batch builds only the ones it uses, because
-- defining a function costs time at every call of the script.
local ALG = {}

-- The constants shared with Rust (TTL_MARGIN_MS, TTL_GRID_MS, IN_FLIGHT_RETRY_AFTER_MS,
-- MAX_USAGE_WINDOW_PRODUCT, the algorithm ids and mode bytes, lua/constants.lua) are written
-- in when the script is assembled. Every number below stays under 2^53, where doubles are exact:
-- a settlement's debt saturates at MAX_USAGE_WINDOW_PRODUCT (usage x window). Costs arrive
-- at most 2^53 - 1 (the client clamps them); a product of one with a window can exceed
-- 2^53 and be inexact, but only where it is compared with, or clamped to, a number far
-- below 2^53, which rounding cannot reach (round to nearest is monotone).

-- The TTL that keeps a key until `expires_at` (ms, on the decision's clock) has passed,
-- plus a margin. A number, not a string: redis.call renders it exactly (it is far below
-- 2^53), and string.format costs more than the rest of a decision.
local function ttl(expires_at, now)
  return max(expires_at - now, 0) + TTL_MARGIN_MS
end

-- When the key of a string state (counter, bucket, fixed window, GCRA) that stops mattering
-- at `expires_at` expires, on the decision's clock: the first multiple of TTL_GRID_MS at or
-- after expires_at + TTL_MARGIN_MS, so between TTL_MARGIN_MS - TTL_GRID_MS (488 ms) and
-- TTL_MARGIN_MS + TTL_GRID_MS (1 512 ms) after it. Written with `PX expiry - now`.
--
-- A key keeps the TTL it has (`SET … KEEPTTL`) when the expiry it was given fell in the
-- same cell of the grid, (expiry - TTL_GRID_MS, expiry]: then it still expires within the
-- bounds above. The invariant that makes this sound: a key's expiry lies in the cell of
-- expires_at + TTL_MARGIN_MS of its state as last written. A write with PX puts it at the
-- cell's end; a write with the exact margin (an earlier version of this script) puts it
-- inside the cell; a KEEPTTL write happens only when the new state's cell is the old one.
-- GCRA and the token bucket move their expiry on every charged request, usually by far
-- less than a grid step, so most of their writes keep the TTL.
--
-- Redis counts a PX from its own time for the command, which can be a millisecond before
-- or after `now` (TIME, read when the script starts, in whole ms): the 488 ms of margin
-- left at worst cover that many times over.
--
-- In Lua, as decide.lua and single.lua write it inline (a function call costs Redis more
-- than the arithmetic):
--   expiry:   t = max(expires_at, now) + TTL_MARGIN_MS; target = t + (-t) % TTL_GRID_MS
--   kept when the state as read expired at `was` (`kept_since` where the algorithm has
--   one): was + TTL_MARGIN_MS in (target - TTL_GRID_MS, target]

-- The states of the counter, bucket, fixed window and GCRA are small records of integers,
-- kept as one string value of little-endian doubles: one GET (an MGET for the whole batch)
-- reads it and one SET ... PX (or KEEPTTL, see the expiry above) writes it with its TTL. decide.lua
-- reads a value of `size` bytes as `{ struct.unpack(layout, v) }` (its `fields` doubles,
-- then where the unpacking stopped) and writes `struct.pack(layout, unpack(s, 1, fields))`.
--
-- The override mark: a state written while its key had no override in force ends with one
-- more byte, NO_OVERRIDE_MARK (`size + 1` bytes, packed with the `marked` layout). The common call in
-- single.lua reads the override key only when the state it read is not marked: most keys
-- never have an override, and a second key in the read costs Redis about 2 500 instructions
-- a decision. What keeps the mark true:
--   * every write of a state reads the key's override in the same call (single.lua reads it
--     when the state is missing or unmarked, decide.lua always), and marks the state only
--     when there is none;
--   * setting an override takes the mark off the key's state, in the same script
--     (set_override.lua);
--   * an override that ends (its TTL, or removal) leaves a state unmarked, which only costs
--     the next call the read.
-- Every reader takes both lengths.
local function packed(layout, marked, size)
  return { layout = layout, size = size, fields = size / 8, marked = marked }
end
