-- tollgate: the constants the Lua scripts share with Rust, generated from the Rust
-- constants by src/store/redis/lua_constants.rs. Do not edit: a test fails when this
-- file differs from what it generates. The stores write each value in place of its
-- name when they assemble a script; benches/scripts/inline_constants.py does the same.
-- how long a key outlives its state (store::redis::TTL_MARGIN_MS)
local TTL_MARGIN_MS = 1000
-- the grid string states' keys expire on (store::redis::TTL_GRID_MS)
local TTL_GRID_MS = 512
-- an in-flight refusal's retry_after (algorithm::in_flight::RETRY_AFTER_MS)
local IN_FLIGHT_RETRY_AFTER_MS = 1000
-- the most usage x window a state holds, debts included (algorithm::MAX_USAGE_WINDOW_PRODUCT)
local MAX_USAGE_WINDOW_PRODUCT = 4503599627370496
-- the most limit or capacity x window a policy has (policy::MAX_CAPACITY_WINDOW_PRODUCT)
local MAX_CAPACITY_WINDOW_PRODUCT = 1125899906842624
-- the algorithms' numbers in ALG (algorithm::registration)
local ALG_SLIDING_WINDOW_COUNTER = 1
local ALG_SLIDING_WINDOW_LOG = 2
local ALG_TOKEN_BUCKET = 3
local ALG_FIXED_WINDOW = 4
local ALG_GCRA = 5
local ALG_IN_FLIGHT = 6
-- a request's mode byte (store::redis::request::Mode)
local MODE_PEEK = 0
local MODE_CHARGE = 1
local MODE_REFUND = 2
local MODE_SETTLE = 3
local MODE_REFRESH = 4
-- the bytes of one policy's parameters (store::redis::wire)
local PARAMS_BYTES = 40
-- the bytes of one state's policy index (store::redis::wire)
local STATE_BYTES = 4
-- the bytes of a request's mode and policy count (store::redis::wire)
local REQUEST_HEAD_BYTES = 5
-- the bytes of a call of one request of one policy (store::redis::wire)
local LONE_REQUEST_BYTES = 61
-- the last byte of a string state written with no override in force (store::redis::wire)
local NO_OVERRIDE_MARK = 78
-- how a leased policy is kept in the ledger (store::leased::Kind)
local KIND_COUNTER = 1
local KIND_LOG = 2
local KIND_BUCKET = 3
local KIND_FIXED = 4
-- the bytes of one policy's part of a ledger call (store::leased::PART_BYTES)
local LEDGER_PART_BYTES = 88
-- a ledger call's mode (store::leased::LedgerMode::code)
local LEDGER_GRANT = 'g'
local LEDGER_PEEK = 'p'
local LEDGER_RETURN = 'r'
local LEDGER_FORCE = 'f'
local LEDGER_RESET = 'x'
local LEDGER_KEEP = 'k'
-- the first argument of a batch of ledger calls (store::redis::lua_constants::LEDGER_BATCH)
local LEDGER_BATCH = 'B'
-- a region script call's mode (store::redis::wire::RegionMode::code)
local REGION_TAKE = 'T'
local REGION_INSTALL = 'I'
local REGION_GIVE_BACK = 'G'
local REGION_DENY = 'D'
local REGION_DRAIN = 'X'
local REGION_END = 'E'
local REGION_RETIRE = 'R'
-- the bytes of one deposit (store::redis::wire::DEPOSIT_BYTES)
local DEPOSIT_BYTES = 136
-- the bytes of one policy's ask in a take (store::redis::wire::REGION_ASK_BYTES)
local REGION_ASK_BYTES = 40
