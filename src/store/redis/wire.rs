//! The wire format of one script call, both ways, in one place: what a batch of requests
//! sends (keys and arguments) and how the packed reply reads back into decisions. The Lua
//! side of the same layout is the header of `lua/decide.lua`. At the end of this file: the
//! modes and sizes of the region script (`lua/region.lua`), which it shares with Rust.
//!
//! Sent, per call:
//!
//! * `KEYS[i]`: state `i`, one per distinct (key, policy), then `KEYS[n + i]`: its override
//!   key (see [`keys`](super::keys)); in a cluster all share one hash slot.
//! * `ARGV[1]`: now in ms, or `""` for the script to read the server's `TIME`.
//! * Three binary strings (little-endian): per policy its [`Params`] (five `f64`); per state
//!   the index of its policy (`u32`, from 1); per request its [`Mode`] (`u8`), its number of
//!   policies `m` (`u32`) and `m` pairs of state index (`u32`, from 1) and cost (`f64`).
//!   Binary, because Redis's Lua parses a decimal argument with `strtod` (about as costly as
//!   a `redis.call`), and each argument is one more string for Redis to build per call.
//!   With one policy and one state (one request, or a hot key's batch) the three strings
//!   travel as one `ARGV[2]`, one after the other: the common call then costs Redis one
//!   argument and one `struct.unpack` instead of three of each.
//!
//! Received: one binary string (little-endian), per request its status (`i8`: 1 allowed, 0
//! denied) then per policy `allowed` (`i8`) and remaining, reset after, retry after and delay
//! (`f64` each, whole numbers); or `-1` (`i8`), a length (`u32`) and a message when a state
//! the request names cannot be read.

use std::collections::HashMap;

use smallvec::SmallVec;

use super::keys::OverrideOf;
use super::request::{Mode, Params, Request};
use super::script_call::ScriptCall;
use crate::algorithm::PolicyDecision;
use crate::decision::Decision;
use crate::error::StoreError;
use crate::policy::Policy;

/// The value of an override key ([`KeyFor::Override`](super::keys::KeyFor)) for `policy` (the
/// overriding policy): its limit and capacity as two little-endian doubles.
pub(crate) fn override_value(policy: &Policy) -> Vec<u8> {
    let mut v = Vec::with_capacity(16);
    v.extend_from_slice(&(policy.limit() as f64).to_le_bytes());
    v.extend_from_slice(&(policy.capacity() as f64).to_le_bytes());
    v
}

/// The byte a counter, token bucket, fixed window or GCRA state ends with when it was
/// written while its key had no override in force: the common call of `lua/single.lua` reads
/// no override key for such a state, and setting an override takes the byte off
/// (`lua/set_override.lua`; the override mark in `lua/prelude.lua`). `N`, for "no override".
pub(crate) const NO_OVERRIDE_MARK: u8 = b'N';

/// The limit and capacity an override key holds, if it reads as one.
pub(crate) fn read_override(value: &[u8]) -> Option<(u64, u64)> {
    let limit = f64::from_le_bytes(value.get(..8)?.try_into().ok()?);
    let capacity = f64::from_le_bytes(value.get(8..16)?.try_into().ok()?);
    (value.len() == 16).then_some((limit as u64, capacity as u64))
}

/// The script's id of the in-flight algorithm, whose request asks one slot whatever it
/// costs: its decisions are never marked for a cost above the capacity.
const IN_FLIGHT_SCRIPT_ID: u64 =
    crate::algorithm::registration(crate::Algorithm::InFlight).script_id as u64;

/// The parameters of `policy` as the script takes them.
pub(crate) fn params(policy: &Policy) -> Params {
    [
        u64::from(crate::algorithm::registration(policy.algorithm()).script_id),
        policy.limit(),
        policy.window_millis(),
        policy.capacity(),
        policy.limits().max_delay_millis(),
    ]
}

/// The script's arguments for one batch: keys and arguments, in the layout of
/// `lua/decide.lua`.
pub(crate) struct Assembled<'a> {
    pub(crate) keys: Vec<&'a str>,
    /// Per policy its five parameters, each a little-endian f64 (exact: all are below 2^53
    /// in practice, and the script computes in doubles anyway).
    pub(crate) params: SmallVec<[u8; 80]>,
    /// Per state, the index of its policy (from 1): little-endian u32.
    pub(crate) states: SmallVec<[u8; 32]>,
    /// Per request: its mode (u8), the number of policies m (u32), m pairs of state index (u32,
    /// from 1) and cost (f64), little-endian.
    pub(crate) requests: Vec<u8>,
}

/// The call of `script` (the decision script) for one assembled batch; `now` is the injected
/// clock's time, if any (otherwise the script reads `TIME`).
pub(crate) fn invocation(
    script: &'static redis::Script,
    batch: &Assembled<'_>,
    now: Option<u64>,
) -> ScriptCall {
    let bytes = 2 * batch.keys.iter().map(|k| k.len() + 2).sum::<usize>()
        + batch.params.len()
        + batch.states.len()
        + batch.requests.len();
    let joined = batch.params.len() == PARAMS_BYTES && batch.states.len() == STATE_BYTES;
    let mut inv = ScriptCall::new(
        script,
        2 * batch.keys.len(),
        if joined { 2 } else { 4 },
        bytes,
    );
    for &k in &batch.keys {
        inv.key(k);
    }
    // Each state's override key, in the same order (same hash tag: same hash slot).
    for &k in &batch.keys {
        inv.key(OverrideOf(k));
    }
    match now {
        Some(now) => inv.arg(now),
        None => inv.arg(""), // the script reads TIME
    };
    if joined {
        inv.arg(Joined([&batch.params, &batch.states, &batch.requests]));
    } else {
        inv.arg(&batch.params[..]);
        inv.arg(&batch.states[..]);
        inv.arg(&batch.requests[..]);
    }
    inv
}

/// The bytes of one policy's parameters: five doubles.
pub(crate) const PARAMS_BYTES: usize = 40;
/// The bytes of one state's policy index.
pub(crate) const STATE_BYTES: usize = 4;
/// The bytes of a request's head: its mode and its number of policies.
pub(crate) const REQUEST_HEAD_BYTES: usize = 5;
/// The bytes of one of a request's (state index, cost) pairs.
const PAIR_BYTES: usize = 12;
/// The bytes of a call of one request of one policy (one argument): what `lua/single.lua`
/// decides from.
pub(crate) const LONE_REQUEST_BYTES: usize =
    PARAMS_BYTES + STATE_BYTES + REQUEST_HEAD_BYTES + PAIR_BYTES;

/// Binary strings sent as one argument, written straight into the command's buffer.
struct Joined<'a>([&'a [u8]; 3]);

impl redis::ToRedisArgs for Joined<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + redis::RedisWrite,
    {
        use std::io::Write;
        let mut arg = out.writer_for_next_arg();
        for part in self.0 {
            // The writer appends to the command's buffer in memory: it cannot fail.
            let _ = arg.write_all(part);
        }
    }
}

/// Splits `batch` into script calls: a state key named with two different parameter sets
/// (two policies of the same name and algorithm but different limits, only possible through
/// direct `Store` use) cannot share one call, so the call ends before the second.
pub(crate) fn assemble(batch: &[Request]) -> SmallVec<[(Assembled<'_>, &[Request]); 1]> {
    let mut out = SmallVec::new();
    let mut start = 0;
    let mut current = Builder::new(batch.len());
    for (i, request) in batch.iter().enumerate() {
        if !current.fits(request) {
            out.push((current.finish(), &batch[start..i]));
            current = Builder::new(batch.len() - i);
            start = i;
        }
        current.push(request);
    }
    if start < batch.len() {
        out.push((current.finish(), &batch[start..]));
    }
    out
}

/// The most states one call names: the script reads them with `unpack(KEYS)` (two keys a
/// state), and Redis's Lua unpacks fewer than 8 000 values at once; a batch with more is
/// split into several calls rather than failed whole.
const MAX_STATES_PER_CALL: usize = 1_900;

/// Up to this many states a call's states are looked up by scanning them; past it, through
/// a map. A scan of a few keys costs less than hashing one (and most calls name one to a
/// dozen states); the map keeps a batch of hundreds of distinct keys linear.
const SCANNED_STATES: usize = 16;

struct Builder<'a> {
    policies: SmallVec<[Params; 4]>,
    /// Each state's key, in order.
    keys: Vec<&'a str>,
    /// Each state's policy (from 1), in the same order.
    of_policy: SmallVec<[u32; 8]>,
    /// Each state's index (from 1) by key, once there are more than [`SCANNED_STATES`].
    index: Option<HashMap<&'a str, u32>>,
    requests: Vec<u8>,
}

impl<'a> Builder<'a> {
    fn new(requests: usize) -> Self {
        Self {
            policies: SmallVec::new(),
            keys: Vec::with_capacity(requests),
            of_policy: SmallVec::new(),
            index: None,
            // One policy per request is the common case.
            requests: Vec::with_capacity(requests * (REQUEST_HEAD_BYTES + PAIR_BYTES)),
        }
    }

    /// The index (from 1) of the state named `key`, if the call names it already.
    fn state(&self, key: &str) -> Option<u32> {
        match &self.index {
            Some(index) => index.get(key).copied(),
            None => self
                .keys
                .iter()
                .position(|&k| k == key)
                .map(|i| index(i + 1)),
        }
    }

    /// The parameters of state `i` (from 1).
    fn params_of(&self, i: u32) -> &Params {
        let policy = self.of_policy[i as usize - 1];
        &self.policies[policy as usize - 1]
    }

    fn fits(&self, request: &Request) -> bool {
        (self.keys.is_empty() || self.keys.len() + request.keys.len() <= MAX_STATES_PER_CALL)
            && request
                .keys
                .iter()
                .zip(&request.params)
                .all(|(k, p)| self.state(k).is_none_or(|i| self.params_of(i) == p))
    }

    fn push(&mut self, request: &'a Request) {
        self.requests.push(request.mode as u8);
        self.requests
            .extend_from_slice(&index(request.keys.len()).to_le_bytes());
        for ((key, params), &amount) in request
            .keys
            .iter()
            .zip(&request.params)
            .zip(&request.amounts)
        {
            let state = match self.state(key) {
                Some(i) => i,
                None => {
                    let policy = match self.policies.iter().position(|p| p == params) {
                        Some(i) => index(i + 1),
                        None => {
                            self.policies.push(*params);
                            index(self.policies.len())
                        }
                    };
                    self.keys.push(key);
                    self.of_policy.push(policy);
                    let i = index(self.keys.len());
                    if let Some(map) = &mut self.index {
                        map.insert(key, i);
                    } else if self.keys.len() > SCANNED_STATES {
                        let map = self
                            .keys
                            .iter()
                            .enumerate()
                            .map(|(j, &k)| (k, index(j + 1)));
                        self.index = Some(map.collect());
                    }
                    i
                }
            };
            self.requests.extend_from_slice(&state.to_le_bytes());
            self.requests
                .extend_from_slice(&amount.wire().to_le_bytes());
        }
    }

    fn finish(self) -> Assembled<'a> {
        let mut params = SmallVec::with_capacity(self.policies.len() * 40);
        for p in &self.policies {
            for &x in p {
                params.extend_from_slice(&(x as f64).to_le_bytes());
            }
        }
        let states = self
            .of_policy
            .iter()
            .flat_map(|p| p.to_le_bytes())
            .collect();
        Assembled {
            keys: self.keys,
            params,
            states,
            requests: self.requests,
        }
    }
}

/// A count or index of the script's binary arguments. A batch holds at most `max_batch`
/// (≤ 1024) requests of a handful of policies each, far below `u32::MAX`.
fn index(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Reads the packed reply of one call straight into one result per request (layout in the
/// module docs): per request its status, then per policy `allowed` and four numbers; or `-1`
/// and a message.
///
/// A reply cut short, with bytes left over, or with a number that is not whole fails the
/// whole call; a negative number, or an overall answer that disagrees with the per-policy
/// ones, fails its own request.
///
/// The results are appended to `results`; when the call fails, `results` is left as it was.
pub(crate) fn parse_batch_reply_into(
    reply: &[u8],
    requests: &[Request],
    results: &mut Vec<Result<Decision, StoreError>>,
) -> Result<(), StoreError> {
    let start = results.len();
    let read = read_batch_reply(reply, requests, results);
    if read.is_err() {
        results.truncate(start);
    }
    read
}

/// [`parse_batch_reply_into`] a vector of its own.
#[cfg(test)]
pub(crate) fn parse_batch_reply(
    reply: &[u8],
    requests: &[Request],
) -> Result<Vec<Result<Decision, StoreError>>, StoreError> {
    let mut results = Vec::new();
    parse_batch_reply_into(reply, requests, &mut results).map(|()| results)
}

fn read_batch_reply(
    reply: &[u8],
    requests: &[Request],
    results: &mut Vec<Result<Decision, StoreError>>,
) -> Result<(), StoreError> {
    let mut reader = Reader { rest: reply };
    for request in requests {
        let status = reader.byte()? as i8;
        if status == -1 {
            let len = reader.u32()? as usize;
            let message = String::from_utf8_lossy(reader.take(len)?).into_owned();
            results.push(Err(StoreError::Backend(crate::error::Cause::from(message))));
            continue;
        }
        results.push(reader.decision(status, request)?);
    }
    if !reader.rest.is_empty() {
        return Err(StoreError::Protocol(crate::error::Cause::from(format!(
            "the decision script's reply has {} bytes left over after {} requests",
            reader.rest.len(),
            requests.len()
        ))));
    }
    Ok(())
}

/// Reads the little-endian fields of a packed reply, failing on a reply cut short.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], StoreError> {
        if self.rest.len() < n {
            return Err(StoreError::Protocol(crate::error::Cause::from(
                "the decision script's reply is cut short",
            )));
        }
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(head)
    }

    fn byte(&mut self) -> Result<u8, StoreError> {
        Ok(self.take(1)?[0])
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], StoreError> {
        let mut b = [0; N];
        b.copy_from_slice(self.take(N)?);
        Ok(b)
    }

    fn u32(&mut self) -> Result<u32, StoreError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    /// A whole number sent as a double (every value is an integer below 2^53).
    fn number(&mut self) -> Result<i64, StoreError> {
        let v = f64::from_le_bytes(self.array()?);
        const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
        if v.fract() != 0.0 || !(-EXACT..=EXACT).contains(&v) {
            return Err(StoreError::Protocol(crate::error::Cause::from(format!(
                "the decision script's reply holds {v} where a whole number belongs"
            ))));
        }
        Ok(v as i64)
    }

    /// One request's answer after its status byte: per policy (of `params`) `allowed` (i8)
    /// and remaining, reset after, retry after and delay (whole numbers sent as doubles).
    /// The outer error fails the call (a reply cut short, a number that is not whole); the
    /// inner one fails this request (a negative number, an overall answer that disagrees).
    ///
    /// A charge or a look whose cost the script denied for being above the capacity in
    /// force is marked as the memory store marks it ([`PolicyDecision::exceeds_capacity`]),
    /// from the cost sent: the script need not say so. Not an in-flight policy's, whose
    /// request asks one slot whatever it costs (a charge sends its slot id, a look its cost).
    fn decision(
        &mut self,
        status: i8,
        request: &Request,
    ) -> Result<Result<Decision, StoreError>, StoreError> {
        let params = &request.params[..];
        let asked = matches!(request.mode, Mode::Charge | Mode::Peek);
        // The first negative field, in the order the reply holds them.
        let mut negative = None;
        let mut unsigned = |v: i64| {
            u64::try_from(v).unwrap_or_else(|_| {
                negative.get_or_insert(v);
                0
            })
        };
        let mut decisions = SmallVec::<[PolicyDecision; 2]>::new();
        for (p, &amount) in params.iter().zip(&request.amounts) {
            let flag = unsigned(i64::from(self.byte()? as i8));
            let remaining = unsigned(self.number()?);
            let reset_after = unsigned(self.number()?);
            let retry_after = unsigned(self.number()?);
            let delay = unsigned(self.number()?);
            // The decision's limit is the policy's capacity, or a per-key override's (sent
            // after the numbers, flagged by `allowed + 2`; for a shaping policy the
            // override's limit follows, which the longest wait's room depends on).
            let (allowed, capacity, limit) = if flag >= 2 {
                let capacity = unsigned(self.number()?);
                let limit = if p[4] > 0 {
                    unsigned(self.number()?)
                } else {
                    p[1]
                };
                (flag - 2, capacity, limit)
            } else {
                (flag, p[3], p[1])
            };
            let d = PolicyDecision::from_parts(
                allowed == 1,
                capacity,
                remaining,
                reset_after,
                retry_after,
                delay,
            );
            decisions.push(match amount.units() {
                Some(cost) if asked && p[0] != IN_FLIGHT_SCRIPT_ID => {
                    d.for_cost(cost, || crate::policy::shaping_slack(limit, p[2], p[4]))
                }
                _ => d,
            });
        }
        if let Some(v) = negative {
            return Ok(Err(StoreError::Protocol(crate::error::Cause::from(
                format!("negative value {v} in the script reply"),
            ))));
        }
        let decision = Decision::from_policies(decisions);
        if decision.is_allowed() != (status == 1) {
            return Ok(Err(StoreError::Protocol(crate::error::Cause::from(
                "the script's overall answer disagrees with its per-policy answers",
            ))));
        }
        Ok(Ok(decision))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::redis::request::Amount;

    /// A batch of many requests on distinct keys is split into calls the script can
    /// unpack, each request in exactly one of them, in order.
    #[test]
    fn a_large_batch_is_split_below_luas_unpack_limit() {
        let names: Vec<String> = (0..4096).map(|i| format!("k{i}")).collect();
        let batch: Vec<Request> = names
            .chunks(4)
            .map(|keys| request(&keys.iter().map(String::as_str).collect::<Vec<_>>()))
            .collect();
        let calls = assemble(&batch);
        assert!(calls.len() >= 3, "{} calls", calls.len());
        let mut seen = 0;
        for (assembled, requests) in &calls {
            assert!(2 * assembled.keys.len() < 8_000, "{}", assembled.keys.len());
            assert!(std::ptr::eq(&requests[0], &batch[seen]));
            seen += requests.len();
        }
        assert_eq!(seen, batch.len());
    }

    fn request(keys: &[&str]) -> Request {
        Request {
            keys: keys.iter().map(|k| k.to_string()).collect(),
            params: keys.iter().map(|_| [5, 10, 1_000, 10, 0]).collect(),
            amounts: keys.iter().map(|_| Amount::Units(1)).collect(),
            mode: Mode::Charge,
            reply: None,
        }
    }

    /// The command's arguments after `EVALSHA <sha> <numkeys>` and the keys.
    fn script_args(batch: &[Request]) -> Vec<Vec<u8>> {
        let calls = assemble(batch);
        assert_eq!(calls.len(), 1);
        let (assembled, _) = &calls[0];
        let inv = invocation(crate::store::redis::script::script(), assembled, None);
        inv.cmd()
            .args_iter()
            .skip(3 + 2 * assembled.keys.len())
            .map(|a| match a {
                redis::Arg::Simple(bytes) => bytes.to_vec(),
                _ => panic!("only plain arguments in a script call"),
            })
            .collect()
    }

    #[test]
    fn one_policy_and_one_state_travel_as_one_argument() {
        // A lone decision: the 61 bytes lua/single.lua decides from.
        let args = script_args(&[request(&["k"])]);
        assert_eq!(args.len(), 2);
        assert_eq!((args[0].len(), args[1].len()), (0, LONE_REQUEST_BYTES));
        assert_eq!(LONE_REQUEST_BYTES, 61);
        assert_eq!(args[1][40..44], 1u32.to_le_bytes());
        // A hot key's batch: still one state, so one argument that decide.lua splits.
        let args = script_args(&[request(&["k"]), request(&["k"]), request(&["k"])]);
        assert_eq!(args.len(), 2);
        assert_eq!(args[1].len(), 44 + 3 * 17);
        // Two policies: three strings.
        let args = script_args(&[request(&["k", "l"])]);
        let lengths: Vec<usize> = args.iter().map(Vec::len).collect();
        assert_eq!(lengths, [0, 40, 8, 5 + 2 * 12]);
    }
}

/// A call of the region script: what it does to the deposits it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RegionMode {
    /// Take a block, or a request's cost, from every deposit (all or nothing).
    Take,
    /// Put new deposits in place of the old ones, answering the old.
    Install,
    /// Give a block's unused units back to the deposit it came from.
    GiveBack,
    /// Record that the home refused, until a time.
    Deny,
    /// Remove every deposit, answering them.
    Drain,
    /// Remove the deposits that are still a given block and have ended, answering them.
    End,
    /// Remove a deposit a renewal replaced, once its last block has ended, answering it.
    Retire,
}

impl RegionMode {
    pub(crate) const ALL: [RegionMode; 7] = [
        RegionMode::Take,
        RegionMode::Install,
        RegionMode::GiveBack,
        RegionMode::Deny,
        RegionMode::Drain,
        RegionMode::End,
        RegionMode::Retire,
    ];

    /// The mode's letter, the script's first argument.
    pub(crate) fn code(self) -> &'static str {
        match self {
            RegionMode::Take => "T",
            RegionMode::Install => "I",
            RegionMode::GiveBack => "G",
            RegionMode::Deny => "D",
            RegionMode::Drain => "X",
            RegionMode::End => "E",
            RegionMode::Retire => "R",
        }
    }

    /// The mode's name in the script.
    pub(crate) fn lua_name(self) -> &'static str {
        match self {
            RegionMode::Take => "REGION_TAKE",
            RegionMode::Install => "REGION_INSTALL",
            RegionMode::GiveBack => "REGION_GIVE_BACK",
            RegionMode::Deny => "REGION_DENY",
            RegionMode::Drain => "REGION_DRAIN",
            RegionMode::End => "REGION_END",
            RegionMode::Retire => "REGION_RETIRE",
        }
    }
}

/// The bytes of one deposit as the script keeps and answers it: seventeen doubles.
pub(crate) const DEPOSIT_BYTES: usize = 17 * 8;

/// The bytes of one policy's ask in a take: cost, wanted, units given back, when they were
/// taken, and whether the deposit is renewed on time.
pub(crate) const REGION_ASK_BYTES: usize = 5 * 8;
