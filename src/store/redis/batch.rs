//! Coalescing concurrent decisions into one script call.
//!
//! A decision is sent at once when fewer than `max_in_flight` script calls are in flight on
//! its lane (the whole server, or one cluster slot): at low load nothing waits and nothing is
//! added. Otherwise it queues, and when a call comes back the queue leaves as the next call,
//! up to `max_batch` decisions in arrival order. One script call then reads each state once,
//! decides every request in order against the states as the earlier ones left them, and
//! writes each state once, so a hot key costs one read and one write per batch instead of
//! per request, and every caller still gets its own exact decision.
//!
//! Queued batches run in tasks of their own, so a caller that gives up (a timeout) takes no
//! one else's decision with it.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

use parking_lot::Mutex;
use smallvec::SmallVec;
use tokio::sync::oneshot;

use crate::algorithm::PolicyDecision;
use crate::decision::Decision;
use crate::error::StoreError;

/// A policy's parameters as the script takes them: algorithm id, limit, window ms,
/// capacity, max delay ms.
pub(crate) type Params = [u64; 5];

/// What a request asks of its states: the mode byte of `lua/decide.lua`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Evaluate only.
    Peek = 0,
    /// Evaluate, and charge when every policy allows.
    Charge = 1,
    /// Give back up to each cost (see [`Store::refund`](crate::store::Store::refund)).
    Refund = 2,
}

/// One decision waiting for, or in, a script call.
pub(crate) struct Request {
    /// The state key of each policy.
    pub(crate) keys: SmallVec<[String; 2]>,
    pub(crate) params: SmallVec<[Params; 2]>,
    pub(crate) costs: SmallVec<[u64; 2]>,
    pub(crate) mode: Mode,
    /// Where a queued request's answer goes; `None` for the caller that runs its own call.
    pub(crate) reply: Option<oneshot::Sender<Result<Decision, StoreError>>>,
}

impl Request {
    pub(crate) fn abandoned(&self) -> bool {
        self.reply.as_ref().is_some_and(oneshot::Sender::is_closed)
    }

    pub(crate) fn answer(self, result: Result<Decision, StoreError>) {
        if let Some(tx) = self.reply {
            // The caller may have given up; its answer is then dropped.
            let _ = tx.send(result);
        }
    }
}

/// How many calls a lane has in flight and who waits for the next one.
#[derive(Default)]
struct Lane {
    in_flight: usize,
    waiting: Vec<Request>,
}

/// The lanes of one store.
pub(crate) struct Lanes<L> {
    lanes: Mutex<HashMap<L, Lane>>,
    pub(crate) max_batch: usize,
    pub(crate) max_in_flight: usize,
}

/// What a caller does with its request.
pub(crate) enum Admission<L: Copy + Hash + Eq + Send + 'static> {
    /// Run it now, holding an in-flight place of the lane until the call ends.
    Run(InFlight<L>, Request),
    /// Queued: the answer comes through this receiver.
    Queued(oneshot::Receiver<Result<Decision, StoreError>>),
}

/// Something that runs batches: the store core.
pub(crate) trait Runner<L>: Send + Sync + 'static {
    /// Sends one script call deciding `batch` in order, answering every request in it.
    fn run(self: Arc<Self>, batch: Vec<Request>) -> crate::store::BoxFuture<()>;

    /// The lanes of this runner.
    fn lanes(&self) -> &Lanes<L>;
}

impl<L: Copy + Hash + Eq + Send + 'static> Lanes<L> {
    pub(crate) fn new(max_batch: usize, max_in_flight: usize) -> Self {
        Self {
            lanes: Mutex::new(HashMap::new()),
            max_batch: max_batch.max(1),
            max_in_flight: max_in_flight.max(1),
        }
    }

    /// Admits `request` on `lane`: to be run by the caller, or queued.
    pub(crate) fn admit<R: Runner<L>>(
        runner: &Arc<R>,
        lane: L,
        mut request: Request,
    ) -> Admission<L> {
        let lanes = runner.lanes();
        let mut map = lanes.lanes.lock();
        let state = map.entry(lane).or_default();
        if state.in_flight < lanes.max_in_flight || lanes.max_batch == 1 {
            state.in_flight += 1;
            drop(map);
            let guard = InFlight {
                runner: Arc::clone(runner) as Arc<dyn Runner<L>>,
                lane,
            };
            Admission::Run(guard, request)
        } else {
            let (tx, rx) = oneshot::channel();
            request.reply = Some(tx);
            state.waiting.push(request);
            Admission::Queued(rx)
        }
    }
}

/// An in-flight place on a lane. When it is given back (the call ended, or its caller gave
/// up), the requests that queued meanwhile leave as the next call, in a task of their own.
pub(crate) struct InFlight<L: Copy + Hash + Eq + Send + 'static> {
    runner: Arc<dyn Runner<L>>,
    lane: L,
}

impl<L: Copy + Hash + Eq + Send + 'static> Drop for InFlight<L> {
    fn drop(&mut self) {
        loop {
            let batch = {
                let mut map = self.runner.lanes().lanes.lock();
                let max_batch = self.runner.lanes().max_batch;
                let Some(state) = map.get_mut(&self.lane) else {
                    return;
                };
                state.waiting.retain(|r| !r.abandoned());
                if state.waiting.is_empty() {
                    state.in_flight -= 1;
                    if state.in_flight == 0 {
                        map.remove(&self.lane);
                    }
                    return;
                }
                let n = state.waiting.len().min(max_batch);
                state.waiting.drain(..n).collect::<Vec<_>>()
            };
            match tokio::runtime::Handle::try_current() {
                Ok(handle) => {
                    // The place passes to the next call.
                    let next = InFlight {
                        runner: Arc::clone(&self.runner),
                        lane: self.lane,
                    };
                    let run = Arc::clone(&next.runner).run(batch);
                    handle.spawn(async move {
                        run.await;
                        drop(next);
                    });
                    return;
                }
                Err(_) => {
                    for r in batch {
                        r.answer(Err(StoreError::Connection(
                            "no tokio runtime to send the decision from".into(),
                        )));
                    }
                    // This place stays taken: the loop hands it to the next batch.
                }
            }
        }
    }
}

/// The script's arguments for one batch: keys and arguments, in the layout of
/// `lua/decide.lua`.
pub(crate) struct Assembled<'a> {
    pub(crate) keys: Vec<&'a str>,
    /// The number of policies, then five parameters per policy.
    pub(crate) args: Vec<u64>,
    /// Per state, the index of its policy (from 1): little-endian u32.
    pub(crate) states: Vec<u8>,
    /// Per request: its mode (u8), the number of policies m (u32), m pairs of state index (u32,
    /// from 1) and cost (f64), little-endian.
    pub(crate) requests: Vec<u8>,
}

/// The answer of a queued request; an error when its call was dropped unanswered (the
/// runtime shut down under it).
pub(crate) async fn queued_answer(
    rx: oneshot::Receiver<Result<Decision, StoreError>>,
) -> Result<Decision, StoreError> {
    rx.await.unwrap_or_else(|_| {
        Err(StoreError::Connection(
            "the batched script call was dropped before it answered".into(),
        ))
    })
}

/// Splits `batch` into script calls: a state key named with two different parameter sets
/// (two policies of the same name and algorithm but different limits, only possible through
/// direct `Store` use) cannot share one call, so the call ends before the second.
pub(crate) fn assemble(batch: &[Request]) -> Vec<(Assembled<'_>, &[Request])> {
    let mut out = Vec::new();
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

struct Builder<'a> {
    policies: SmallVec<[Params; 4]>,
    /// Each state: its key, and the index of its policy (from 1).
    states: Vec<(&'a str, u32)>,
    index: HashMap<&'a str, (u32, Params)>,
    requests: Vec<u8>,
}

impl<'a> Builder<'a> {
    fn new(requests: usize) -> Self {
        Self {
            policies: SmallVec::new(),
            states: Vec::with_capacity(requests),
            index: HashMap::with_capacity(requests),
            // One policy per request is the common case: 5 + 12 bytes.
            requests: Vec::with_capacity(requests * 17),
        }
    }

    fn fits(&self, request: &Request) -> bool {
        request.keys.iter().zip(&request.params).all(|(k, p)| {
            self.index
                .get(k.as_str())
                .is_none_or(|(_, known)| known == p)
        })
    }

    fn push(&mut self, request: &'a Request) {
        self.requests.push(request.mode as u8);
        self.requests
            .extend_from_slice(&index(request.keys.len()).to_le_bytes());
        for ((key, params), &cost) in request.keys.iter().zip(&request.params).zip(&request.costs) {
            let state = match self.index.get(key.as_str()) {
                Some(&(i, _)) => i,
                None => {
                    let policy = match self.policies.iter().position(|p| p == params) {
                        Some(i) => index(i + 1),
                        None => {
                            self.policies.push(*params);
                            index(self.policies.len())
                        }
                    };
                    self.states.push((key, policy));
                    let i = index(self.states.len());
                    self.index.insert(key, (i, *params));
                    i
                }
            };
            self.requests.extend_from_slice(&state.to_le_bytes());
            // Lua numbers are doubles: a cost above 2^53 was never exact in the script.
            self.requests
                .extend_from_slice(&(cost as f64).to_le_bytes());
        }
    }

    fn finish(self) -> Assembled<'a> {
        let mut args = Vec::with_capacity(1 + self.policies.len() * 5);
        args.push(self.policies.len() as u64);
        for p in &self.policies {
            args.extend_from_slice(p);
        }
        let mut keys = Vec::with_capacity(self.states.len());
        let mut states = Vec::with_capacity(self.states.len() * 4);
        for (key, policy) in self.states {
            keys.push(key);
            states.extend_from_slice(&policy.to_le_bytes());
        }
        Assembled {
            keys,
            args,
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

/// Reads the packed reply of one call into one result per request (layout in
/// `lua/decide.lua`): per request `allowed` then five numbers per policy, or `-1` and a
/// message.
pub(crate) fn parse_batch_reply(
    reply: &[u8],
    requests: &[Request],
) -> Result<Vec<Result<Decision, StoreError>>, StoreError> {
    let mut results = Vec::with_capacity(requests.len());
    let mut reader = Reader { rest: reply };
    for request in requests {
        let status = i64::from(reader.byte()? as i8);
        if status == -1 {
            let len = reader.u32()? as usize;
            let message = String::from_utf8_lossy(reader.take(len)?).into_owned();
            results.push(Err(StoreError::Backend(message)));
            continue;
        }
        let m = request.keys.len();
        let mut fields: SmallVec<[i64; 11]> = SmallVec::with_capacity(1 + 5 * m);
        fields.push(status);
        for _ in 0..m {
            fields.push(i64::from(reader.byte()? as i8));
            for _ in 0..4 {
                fields.push(reader.number()?);
            }
        }
        let limits: SmallVec<[u64; 2]> = request.params.iter().map(|p| p[3]).collect();
        results.push(parse_reply(&fields, &limits));
    }
    if !reader.rest.is_empty() {
        return Err(StoreError::Protocol(format!(
            "the decision script's reply has {} bytes left over after {} requests",
            reader.rest.len(),
            requests.len()
        )));
    }
    Ok(results)
}

/// Reads the little-endian fields of a packed reply, failing on a reply cut short.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], StoreError> {
        if self.rest.len() < n {
            return Err(StoreError::Protocol(
                "the decision script's reply is cut short".into(),
            ));
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
            return Err(StoreError::Protocol(format!(
                "the decision script's reply holds {v} where a whole number belongs"
            )));
        }
        Ok(v as i64)
    }
}

/// `{ allowed, then per policy: allowed, remaining, reset_after, retry_after, delay }`.
pub(crate) fn parse_reply(reply: &[i64], limits: &[u64]) -> Result<Decision, StoreError> {
    if reply.len() != 1 + 5 * limits.len() {
        return Err(StoreError::Protocol(format!(
            "the decision script returned {} integers for {} policies",
            reply.len(),
            limits.len()
        )));
    }
    let field = |i: usize| -> Result<u64, StoreError> {
        u64::try_from(reply[i]).map_err(|_| {
            StoreError::Protocol(format!("negative value {} in the script reply", reply[i]))
        })
    };
    let mut decisions = SmallVec::<[PolicyDecision; 2]>::new();
    for (i, &limit) in limits.iter().enumerate() {
        let o = 1 + 5 * i;
        decisions.push(PolicyDecision::from_parts(
            field(o)? == 1,
            limit,
            field(o + 1)?,
            field(o + 2)?,
            field(o + 3)?,
            field(o + 4)?,
        ));
    }
    let decision = Decision::from_policies(decisions);
    if decision.is_allowed() != (reply[0] == 1) {
        return Err(StoreError::Protocol(
            "the script's overall answer disagrees with its per-policy answers".into(),
        ));
    }
    Ok(decision)
}
