//! A region's dealings with the home: taking from deposits, renewing them from the home,
//! giving replaced ones back, deciding a request at the home when no deposit can, and
//! tracing where a refunded request's units came from.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use smallvec::SmallVec;

use super::deposit::{self, answer, deposits, done, waiting_request, Ask, Deposit, Next, Took};
use super::returns::Gone;
use super::stats::{bump, Counters};
use crate::error::{Cause, StoreError};
use crate::key::Key;
use crate::policy::Policy;
use crate::store::leased::{
    Kind, LeaseBackend, LedgerCall, LedgerMode, LedgerReply, Part, Returned,
};
use crate::store::{RedisStore, Store};

/// How many exact decisions a region remembers the origin of, for their refunds.
const ORIGINS: usize = 16_384;

/// Where the units of a request decided exactly came from: a refund goes back there.
#[derive(Debug, Clone, Copy, Default)]
enum Origin {
    #[default]
    Deposit,
    /// The home decided it, at this time on its clock, in this generation of its store (a
    /// restarted home never counted it).
    Home(u64, u64),
}

/// Values by id, the oldest forgotten past [`ORIGINS`].
#[derive(Debug, Default)]
struct Ids<T> {
    by_id: HashMap<u64, T>,
    order: VecDeque<u64>,
}

impl<T> Ids<T> {
    fn remember(&mut self, id: u64, value: T) {
        while self.by_id.len() >= ORIGINS || self.order.len() >= 2 * ORIGINS {
            match self.order.pop_front() {
                Some(old) => {
                    self.by_id.remove(&old);
                }
                None => break,
            }
        }
        self.by_id.insert(id, value);
        self.order.push_back(id);
    }
}

/// One region: its Redis, the home, and what it counts.
#[derive(Debug)]
pub(super) struct Region<H> {
    pub(super) name: Box<str>,
    pub(super) local: RedisStore,
    pub(super) home: H,
    pub(super) home_lease_ms: u64,
    fraction: f64,
    origins: parking_lot::Mutex<Ids<Origin>>,
    /// The home's generation when it granted each deposit this instance installed: one
    /// granted before the home restarted is not given back (the fresh home never counted
    /// it, and its unused units would come off other regions' charges).
    grants: parking_lot::Mutex<Ids<u64>>,
    next_block: AtomicU64,
    pub(super) counters: Counters,
}

pub(super) type Policies = SmallVec<[Policy; 2]>;

/// Runs `work` to its end in a task of its own, whether or not its caller waits for it.
async fn whole(
    what: &str,
    work: impl std::future::Future<Output = Result<LedgerReply, StoreError>> + Send + 'static,
) -> Result<LedgerReply, StoreError> {
    tokio::spawn(work).await.unwrap_or_else(|e| {
        Err(StoreError::Protocol(Cause::from(format!(
            "a region's {what} did not finish: {e}"
        ))))
    })
}

fn kinds(policies: &[Policy]) -> Result<SmallVec<[Kind; 2]>, StoreError> {
    policies
        .iter()
        .map(|p| {
            Kind::of(p).ok_or_else(|| {
                StoreError::Protocol(Cause::from(format!(
                    "policy {:?} cannot be leased, so it has no deposit",
                    p.name()
                )))
            })
        })
        .collect()
}

impl<H: LeaseBackend> Region<H> {
    pub(super) fn new(
        name: Box<str>,
        local: RedisStore,
        home: H,
        home_lease_ms: u64,
        fraction: f64,
    ) -> Self {
        // Block ids name log entries in the home ledger: unique across regions and
        // instances, and exact in a double (below 2^53).
        let seed = {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u32(std::process::id());
            h.write(name.as_bytes());
            h.finish() >> 12
        };
        Self {
            name,
            local,
            home,
            home_lease_ms,
            fraction,
            origins: parking_lot::Mutex::default(),
            grants: parking_lot::Mutex::default(),
            next_block: AtomicU64::new(seed.max(1)),
            counters: Counters::default(),
        }
    }

    fn remember(&self, id: u64, origin: Origin) {
        self.origins.lock().remember(id, origin);
    }

    /// Decided at the home now, at `at` on its clock.
    fn at_home(&self, at: u64) -> Origin {
        Origin::Home(at, self.home.generation())
    }

    fn forget(&self, id: u64) -> Option<Origin> {
        self.origins.lock().by_id.remove(&id)
    }

    /// Whether the deposit of home block `block` was granted by the home as it is now: not
    /// when this instance installed it before the home restarted (one another instance
    /// installed is not known here, and goes home as before).
    pub(super) fn granted_by_this_home(&self, block: u64) -> bool {
        let granted = self.grants.lock().by_id.remove(&block);
        granted.is_none_or(|g| g == self.home.generation())
    }

    pub(super) fn home_call(&self, call: &'static str) {
        crate::telemetry::region_home_call(&self.name, call);
    }

    pub(super) fn units(&self, flow: &'static str, units: u64) {
        if units > 0 {
            crate::telemetry::region_units(&self.name, flow, units);
        }
    }

    /// One ledger call of an instance of the region.
    pub(super) async fn call(
        self: Arc<Self>,
        key: Key,
        policies: Policies,
        call: LedgerCall,
    ) -> Result<LedgerReply, StoreError> {
        match call.mode {
            LedgerMode::Grant => self.grant(key, policies, call).await,
            LedgerMode::Return => self.give_back(&key, &policies, call).await,
            // In a task of its own: a caller that gives up after the home's answer does not
            // skip the drain.
            LedgerMode::Force => {
                whole("settlement", async move {
                    let reply = self.forward(&key, &policies, call).await?;
                    if !reply.granted {
                        // A debt stands: nothing charged before it may be lent after it.
                        self.empty(&key, &policies, true).await?;
                    }
                    Ok(reply)
                })
                .await
            }
            LedgerMode::Reset => {
                // Emptied before the home's reset, so that nothing is lent while it is under
                // way, and after it: a renewal the home granted before its reset began
                // before this second drain, so it is not installed (`deposit::install`). In
                // a task of its own: a caller that gives up after the home's reset does not
                // skip the second drain.
                whole("reset", async move {
                    self.empty(&key, &policies, false).await?;
                    let reply = self.forward(&key, &policies, call).await?;
                    self.empty(&key, &policies, false).await?;
                    Ok(reply)
                })
                .await
            }
            LedgerMode::Peek | LedgerMode::Keep => self.forward(&key, &policies, call).await,
        }
    }

    async fn forward(
        &self,
        key: &Key,
        policies: &[Policy],
        call: LedgerCall,
    ) -> Result<LedgerReply, StoreError> {
        bump(&self.counters.forwarded, 1);
        self.home_call("forward");
        self.home
            .ledger(key, policies, call)
            .await
            .inspect_err(|_| {
                bump(&self.counters.errors, 1);
                self.home_call("error");
            })
    }

    /// Removes the key's deposits; `give_back`: their unused units go home.
    async fn empty(
        self: &Arc<Self>,
        key: &Key,
        policies: &[Policy],
        give_back: bool,
    ) -> Result<(), StoreError> {
        let kinds = kinds(policies)?;
        let keys = self.local.deposit_keys(key, policies, &kinds);
        let (now, old) = deposit::drain(&self.local, &keys, give_back).await?;
        if give_back {
            self.send_home(
                key.clone(),
                policies.iter().cloned().collect(),
                kinds,
                old,
                now,
                Gone::SetAside,
            );
        }
        Ok(())
    }

    async fn grant(
        self: Arc<Self>,
        key: Key,
        policies: Policies,
        call: LedgerCall,
    ) -> Result<LedgerReply, StoreError> {
        let kinds = kinds(&policies)?;
        let keys = self.local.deposit_keys(&key, &policies, &kinds);
        let asks: SmallVec<[Ask; 2]> = call
            .parts
            .iter()
            .map(|p| Ask {
                cost: p.cost,
                wanted: p.wanted.max(p.cost),
                back: if call.previous_block != 0 {
                    p.returned.unused
                } else {
                    0
                },
                back_at: p.returned.granted_at,
                timed: matches!(p.kind, Kind::Bucket | Kind::Log),
            })
            .collect();
        let took =
            deposit::take(&self.local, &keys, call.lease_ms, self.home_lease_ms, &asks).await?;
        let dropped = asks
            .iter()
            .zip(&took.kept)
            .map(|(a, &k)| a.back.saturating_sub(k))
            .max()
            .unwrap_or(0);
        if dropped > 0 {
            bump(&self.counters.units_dropped, dropped);
            self.units("dropped", dropped);
        }
        if took.allowed {
            if took.next == Next::RenewLater {
                let me = Arc::clone(&self);
                let (key, policies, took) = (key.clone(), policies.clone(), took.clone());
                tokio::spawn(async move {
                    let _ = me.renew(key, policies, kinds, keys, took, None).await;
                });
            }
            if call.lease_ms == 0 {
                self.remember(call.block_id, Origin::Deposit);
            }
            let answers = took
                .parts
                .iter()
                .map(|(g, d)| answer(*g, d, took.now, 0))
                .collect();
            return Ok(LedgerReply {
                granted: true,
                lease_ms: took.lease,
                now_ms: took.now,
                answers,
            });
        }
        match took.next {
            Next::Denied => {
                // A denial leaves no deposit behind it: its numbers are the policy's own.
                let answers = took
                    .parts
                    .iter()
                    .zip(policies.iter())
                    .map(|((_, d), p)| {
                        let mut a = answer(0, d, took.now, d.denied_until.saturating_sub(took.now));
                        a.retry_after_ms = a.retry_after_ms.max(1);
                        if a.limit == 0 {
                            (a.limit, a.capacity) = (p.limit(), p.capacity());
                        }
                        a
                    })
                    .collect();
                Ok(LedgerReply {
                    granted: false,
                    lease_ms: 0,
                    now_ms: took.now,
                    answers,
                })
            }
            Next::RenewNow => {
                // In a task of its own: a caller that gives up does not strand the block the
                // home granted, nor the renewal it holds.
                let costs = Some((call.block_id, call.parts.iter().map(|p| p.cost).collect()));
                let task = tokio::spawn(self.renew(key, policies, kinds, keys, took, costs));
                match task.await {
                    Ok(Ok(Some(reply))) => Ok(reply),
                    Ok(Ok(None)) => Err(StoreError::Protocol(Cause::from(
                        "a region's renewal answered no decision",
                    ))),
                    Ok(Err(e)) => Err(e),
                    Err(e) => Err(StoreError::Protocol(Cause::from(format!(
                        "a region's renewal did not finish: {e}"
                    )))),
                }
            }
            _ => self.exact_at_home(&key, &policies, call, took.now).await,
        }
    }

    /// One request decided by the home, exactly (no block).
    async fn exact_at_home(
        &self,
        key: &Key,
        policies: &[Policy],
        mut call: LedgerCall,
        region_now: u64,
    ) -> Result<LedgerReply, StoreError> {
        call.lease_ms = 0;
        call.previous_block = 0;
        for p in &mut call.parts {
            p.wanted = p.cost;
            p.returned = Returned::default();
        }
        let id = call.block_id;
        let reply = self
            .home
            .ledger(key, policies, call)
            .await
            .inspect_err(|_| {
                bump(&self.counters.errors, 1);
                self.home_call("error");
            })?;
        bump(&self.counters.exact_at_home, 1);
        self.home_call("exact");
        if reply.granted {
            self.remember(id, self.at_home(reply.now_ms));
        }
        Ok(LedgerReply {
            now_ms: region_now,
            ..reply
        })
    }

    /// Gives back the one unit the home charged renewal `id` (ahead of need, decided exactly
    /// at the home's `at`).
    async fn untake_renewal(
        &self,
        key: &Key,
        policies: &[Policy],
        kinds: &[Kind],
        id: u64,
        at: u64,
    ) {
        let parts = policies
            .iter()
            .zip(kinds)
            .map(|(p, &kind)| {
                let mut part = Part::new(kind, p);
                part.returned = Returned {
                    granted: 1,
                    unused: 1,
                    granted_at: at,
                    lease_ms: 0,
                    rate: 0,
                };
                part
            })
            .collect();
        let call = LedgerCall {
            mode: LedgerMode::Return,
            lease_ms: 0,
            block_id: id,
            previous_block: 0,
            parts,
        };
        match self.home.ledger(key, policies, call).await {
            Ok(_) => {
                bump(&self.counters.returns, 1);
                bump(&self.counters.units_returned, 1);
                self.home_call("return");
                self.units("returned", 1);
            }
            Err(e) => self.lost(1, &e),
        }
    }

    /// The units a deposit of `policy` asks the home for: the region's observed rate over
    /// two home leases, at least what the instance asked for four times over, at most the
    /// largest deposit.
    fn wanted(&self, policy: &Policy, kind: Kind, d: &Deposit, ask: u64, now: u64) -> u64 {
        let whole = if kind == Kind::Bucket {
            if d.capacity > 0 {
                d.capacity
            } else {
                policy.capacity()
            }
        } else if d.limit > 0 {
            d.limit
        } else {
            policy.limit()
        };
        let most = ((whole as f64 * self.fraction) as u64).max(1);
        let observed = if d.installed > 0 && d.taken > 0 {
            let span = now.saturating_sub(d.installed).max(10);
            d.taken.saturating_mul(2 * self.home_lease_ms) / span
        } else {
            0
        };
        observed.max(ask.saturating_mul(4)).min(most)
    }

    /// Takes the key's next block from the home and swaps it in as its deposits. `costs`:
    /// a request waits on it (the block id it asked with, and its costs, taken from the new
    /// block), and gets its decision; otherwise the renewal runs ahead of need.
    async fn renew(
        self: Arc<Self>,
        key: Key,
        policies: Policies,
        kinds: SmallVec<[Kind; 2]>,
        keys: Vec<String>,
        took: Took,
        costs: Option<(u64, SmallVec<[u64; 2]>)>,
    ) -> Result<Option<LedgerReply>, StoreError> {
        let cost_of = |i: usize| costs.as_ref().map_or(1, |(_, c)| c[i]);
        let id = self.next_block.fetch_add(1, Ordering::Relaxed);
        let call = self.renewal_call(&policies, &kinds, &took, id, &cost_of);
        let reply = match self.home.ledger(&key, &policies, call).await {
            Ok(r) => r,
            Err(e) => {
                bump(&self.counters.errors, 1);
                self.home_call("error");
                // The renewal ends: the next caller tries again.
                let _ = deposit::deny(&self.local, &keys, &vec![0; keys.len()]).await;
                return Err(e);
            }
        };
        if !reply.granted {
            return Ok(self.refused(reply, &keys, took.now, costs.is_some()).await);
        }
        if reply.lease_ms == 0 {
            // The home lends this key no block (its limit too small to share, or room for
            // one request and not a block): the request was decided exactly.
            bump(&self.counters.exact_at_home, 1);
            self.home_call("exact");
            let _ = deposit::deny(&self.local, &keys, &vec![0; keys.len()]).await;
            return Ok(match costs {
                Some((request, _)) => {
                    self.remember(request, self.at_home(reply.now_ms));
                    Some(LedgerReply {
                        now_ms: took.now,
                        ..reply
                    })
                }
                None => {
                    // A renewal ahead of need was charged one unit no request takes: it goes
                    // straight back. Dropped, a key held at its limit lost a unit of its
                    // refill to every renewal, and its requests were starved.
                    self.untake_renewal(&key, &policies, &kinds, id, reply.now_ms)
                        .await;
                    None
                }
            });
        }
        let new = deposits(&reply, took.now, id, |i| {
            costs.as_ref().map_or(0, |_| cost_of(i))
        });
        let deposited = new.iter().map(|d| d.granted).max().unwrap_or(0);
        self.home_call("grant");
        let done = match deposit::install(&self.local, &keys, &new, took.now).await {
            Ok(x) => x,
            Err(e) => {
                // The block may or may not be in place: it is not given back (it could be
                // lent), so at worst it is unused until its lease ends.
                bump(&self.counters.units_dropped, deposited);
                self.units("dropped", deposited);
                return Err(e);
            }
        };
        if done.installed {
            self.grants.lock().remember(id, self.home.generation());
            bump(&self.counters.deposits, 1);
            bump(&self.counters.units_deposited, deposited);
            self.units("deposited", deposited);
            self.send_home(
                key.clone(),
                policies.clone(),
                kinds.clone(),
                done.old,
                done.now,
                Gone::SetAside,
            );
            self.when_it_ends(
                key,
                policies,
                kinds,
                keys,
                id,
                new[0].ends.saturating_sub(done.now),
            );
        } else {
            // A reset or a debt came after this renewal began: the block was granted against
            // a count the reset erased (or before the debt), so none of it is lent, nor given
            // back (a return would take units off the count that started afresh). The
            // waiting request keeps what it took: it was decided before the reset.
            let unlent = new.iter().map(|d| d.left).max().unwrap_or(0);
            bump(&self.counters.units_dropped, unlent);
            self.units("dropped", unlent);
            // The renewal ends: the next caller may start another.
            let _ = deposit::deny(&self.local, &keys, &vec![0; keys.len()]).await;
        }
        if let (Some((request, _)), true) = (&costs, done.installed) {
            // The waiting request's units were charged at the home with the block: a give-back
            // of them (capped by the instance at what it was charged) goes home.
            self.remember(*request, self.at_home(reply.now_ms));
        }
        Ok(costs.map(|(_, c)| waiting_request(&reply, &new, &c, done.installed, took.now)))
    }

    /// The home refused a renewal: the region keeps the refusal for the key only when the
    /// home has nothing left for anyone; the waiting request, if any, gets the home's answer.
    async fn refused(
        &self,
        reply: LedgerReply,
        keys: &[String],
        now: u64,
        waiting: bool,
    ) -> Option<LedgerReply> {
        bump(&self.counters.refusals, 1);
        self.home_call("refused");
        let wait = reply
            .answers
            .iter()
            .map(|a| a.retry_after_ms)
            .max()
            .unwrap_or(0);
        // A request refused for its size alone (the home still has units) must not stop
        // smaller ones, or one oversized request a lease would block the key for the whole
        // region.
        let exhausted = reply.answers.iter().any(|a| a.remaining == 0);
        let until = if exhausted {
            now + wait.clamp(1, self.home_lease_ms)
        } else {
            0
        };
        let _ = deposit::deny(&self.local, keys, &vec![until; keys.len()]).await;
        waiting.then_some(LedgerReply {
            now_ms: now,
            ..reply
        })
    }

    /// The home call that renews a key's deposits: a block of every policy, each sized by
    /// [`wanted`](Self::wanted), for one home lease.
    fn renewal_call(
        &self,
        policies: &[Policy],
        kinds: &[Kind],
        took: &Took,
        id: u64,
        cost_of: &dyn Fn(usize) -> u64,
    ) -> LedgerCall {
        let parts = policies
            .iter()
            .zip(kinds)
            .zip(&took.parts)
            .enumerate()
            .map(|(i, ((p, &kind), (_, d)))| {
                let mut part = Part::new(kind, p);
                part.cost = cost_of(i);
                part.wanted = self.wanted(p, kind, d, cost_of(i), took.now).max(part.cost);
                part
            })
            .collect();
        LedgerCall {
            mode: LedgerMode::Grant,
            lease_ms: self.home_lease_ms,
            block_id: id,
            previous_block: 0,
            parts,
        }
    }

    /// An instance gives back a block's unused units, or a refunded request's.
    async fn give_back(
        &self,
        key: &Key,
        policies: &[Policy],
        call: LedgerCall,
    ) -> Result<LedgerReply, StoreError> {
        let now = self.local.now_millis();
        let refund = call.parts.iter().all(|p| p.returned.lease_ms == 0);
        let origin = if refund {
            self.forget(call.block_id)
        } else {
            Some(Origin::Deposit)
        };
        match origin {
            Some(Origin::Deposit) => {
                let kinds = kinds(policies)?;
                let keys = self.local.deposit_keys(key, policies, &kinds);
                let back: SmallVec<[(u64, u64); 2]> = call
                    .parts
                    .iter()
                    .map(|p| (p.returned.unused, p.returned.granted_at))
                    .collect();
                let kept = deposit::give_back(&self.local, &keys, &back).await?;
                // Units no deposit takes back (it ended, or a reset dropped it) are lost
                // until their window or refill frees them.
                let dropped = back
                    .iter()
                    .zip(&kept)
                    .map(|(&(units, _), &k)| units.saturating_sub(k))
                    .max()
                    .unwrap_or(0);
                if dropped > 0 {
                    bump(&self.counters.units_dropped, dropped);
                    self.units("dropped", dropped);
                }
            }
            Some(Origin::Home(_, generation)) if generation != self.home.generation() => {
                // Decided by the home before it restarted: the fresh home never counted it.
                let units = call.parts.iter().map(|p| p.returned.unused).max();
                let units = units.unwrap_or(0);
                bump(&self.counters.units_dropped, units);
                self.units("dropped", units);
            }
            Some(Origin::Home(at, _)) => {
                let mut call = call;
                for p in &mut call.parts {
                    p.returned.granted_at = at;
                }
                self.forward(key, policies, call).await?;
            }
            // A give-back this region did not decide (a settlement or refund of a charge
            // whose block the instance no longer holds: it names the give-back afresh) is
            // dropped: its units stay charged until their window or refill frees them.
            // Sending it home lets a give-back of more than was charged (through the Store
            // API) take the home's count below what deposits hold: the conformance matrix
            // found a region then admitting past the limit.
            None => {
                let units = call
                    .parts
                    .iter()
                    .map(|p| p.returned.unused)
                    .max()
                    .unwrap_or(0);
                bump(&self.counters.units_dropped, units);
                self.units("dropped", units);
            }
        }
        Ok(done(now))
    }
}
