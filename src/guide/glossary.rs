//! The words of tollgate, each with one meaning. Code, docs, metrics and logs use them as
//! defined here.
//!
//! # Deciding
//!
//! * **Key**: who shares a limit ([`Key`](crate::key::Key)): a client address, a user, an
//!   API key's digest, a (client, username) pair. A [key extractor](crate::key::KeyExtractor)
//!   finds it in a request.
//! * **Policy**: one limit ([`Policy`](crate::Policy)): a name, a [rate](crate::Rate), an
//!   [algorithm](crate::Algorithm), and what to do when the store fails.
//! * **Route**: which policies apply to which requests ([`Route`](crate::route::Route)).
//! * **Decision**: every policy's answer for one request ([`Decision`](crate::Decision)). A
//!   request is admitted only if every policy allows it; a refused request is charged
//!   nothing.
//! * **Charge**: the units a decision takes from a key's budget when it admits a request.
//! * **Refusal**: the answer in place of the service's ([`Refusal`](crate::Refusal)): a 429, a
//!   `RESOURCE_EXHAUSTED`, a 403 for a denied address.
//! * **Operation**: one thing a store does to a key's state under some policies, as a value
//!   ([`Op`](crate::store::Op)): check, peek, refund, settle, release, refresh, reset.
//! * **Refund**: units given back after a charge, for a request that turned out not to count
//!   ([`Op::Refund`](crate::store::Op::Refund)).
//! * **Counting rule**: which admitted requests of a route count, decided from the response
//!   head ([`CountWhen`](crate::route::CountWhen)): the charge is held while the request runs
//!   and refunded when the head says it does not count.
//!
//! # Holding
//!
//! * **Slot**: an in-flight request's place under an
//!   [in-flight](crate::Algorithm::InFlight) policy, taken when the request is admitted and
//!   released when it ends. A store names each slot it hands out
//!   ([`Decision::slot`](crate::Decision::slot)) so that only that slot comes back
//!   ([`Op::Release`](crate::store::Op::Release)); where slots expire unless refreshed (Redis),
//!   the holder extends them ([`Op::Refresh`](crate::store::Op::Refresh)). Nothing else is
//!   called a slot (a Redis Cluster *hash slot* is always called that).
//! * **Hold**: what an admitted request keeps until its response ends: its slots and its
//!   reservation. The layer keeps it in the response body; the direct API in a
//!   [`Permit`](crate::Permit) or a [`Reservation`](crate::Reservation).
//! * **Permit**: the hold of [`Limiter::acquire`](crate::Limiter::acquire): slots, released
//!   when it is dropped.
//! * **Reservation**: an estimate charged up front for a request whose cost is known only
//!   after the response (tokens of a completion, bytes of a stream), at least one unit.
//! * **Settlement**: the difference between a reservation and the actual cost, given back or
//!   charged once the cost is known ([`Op::Settle`](crate::store::Op::Settle)). An extra
//!   charge is never forgiven: past the limit it is a **debt** the key pays back at its
//!   policy's rate.
//!
//! # Sharing a limit across instances
//!
//! * **Store**: where limiter state lives ([`Store`](crate::store::Store)): in the process, in
//!   Redis, in a Redis Cluster.
//! * **Ledger**: the shared record, in the store, of how much of a key's limit each instance
//!   holds ([`LeasedStore`](crate::store::leased::LeasedStore)).
//! * **Block**: units of a key's limit an instance holds from the ledger, to admit requests
//!   locally without a call per request.
//! * **Lease**: the time a block is lent for; what is unused when it ends goes back to the
//!   ledger.
//! * **Override**: another limit for one key under one policy, until removed or expired
//!   ([`Override`](crate::Override)).
//! * **Generation**: a number a store changes when it may have lost its state (a Redis
//!   restart or failover), so that caches of its answers are dropped
//!   ([`Store::generation`](crate::store::Store::generation)).
//!
//! # When the store fails
//!
//! * **Failure mode**: what a policy does when its store cannot answer in time: fail open,
//!   fail closed, or decide locally ([`FailureMode`](crate::store::FailureMode)).
//! * **Fallback**: the local limiter a [`ResilientStore`](crate::store::ResilientStore)
//!   decides with under the local-fallback failure mode.
//! * **Deny cache**: recent denials answered again without a call to the store; each is
//!   rechecked in the background and dropped when the store's generation moves.
//! * **Shadow**: a policy counted but never refusing, to try a limit before enforcing it.
//! * **Penalty**: a time for which a key is refused outright after a policy refused it
//!   ([`Policy::builder`](crate::Policy::builder)`.penalty(..)`).
