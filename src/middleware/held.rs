//! What the middleware keeps for a request after it is admitted, until its response ends:
//! the in-flight slots and the costs to settle that the limiter handed it
//! ([`Held`]), settled from the response and kept in its body.
//!
//! At each point a request can end, this is what happens:
//!
//! | the request ends … | in-flight slots | a reservation to settle |
//! |---|---|---|
//! | with a response whose body is sent to the end | given back when the body is dropped | settled from the extension or header as the response head passes (a gRPC call's header, from its trailers as they pass), or from the frames counted when the body ends |
//! | the client disconnects mid-body | given back (the body is dropped) | a stream count is settled with what was counted so far, at least the reservation |
//! | the handler panics, or the future is cancelled | given back (the future is dropped) | the reservation stands |
//! | the store is unreachable at release or settlement | Redis: the slot comes back when its lease ends | the reservation stands (the error is logged) |
//!
//! A route with a [counting rule](crate::route::CountWhen) charges its rate policies when the
//! request is admitted and refunds them when a response head that does not count arrives
//! ([`count`]); with no response head (an inner error, a panic, a cancelled future) the
//! charge stands. A gRPC call's outcome is its `grpc-status`: read from the head of a
//! trailers-only response, else from the trailers when the body ends (for binary gRPC-Web,
//! from the trailers frame at the end of the body); a body that ends or is dropped without
//! one keeps the charge.

use std::sync::Arc;

use bytes::Bytes;
use http::Response;
use smallvec::SmallVec;

use super::grpc_web::WebTrailers;
use crate::count::grpc_status;
use crate::decision::Decision;
use crate::limiter::{Counting, Held, SettleFn, Slots};
use crate::route::{Actual, ActualCost, FrameCostFn};

/// The part of a [`Held`] that travels with the response body.
pub(crate) struct BodyHold {
    _slots: Option<Slots>,
    stream: Option<StreamCount>,
    /// A gRPC call's counting rule, waiting for the `grpc-status` in its trailers. Dropped
    /// without them (the body cut short, or ended with no status), the charge stands.
    counting: Option<Counting>,
    /// A gRPC-Web body's reader, whose trailers travel in the body.
    web: Option<WebTrailers>,
    /// A gRPC call's metered policies whose cost header was not in the head: read from the
    /// trailers (gRPC's trailing metadata, where a server reports what it learned at the end).
    trailer_costs: Option<TrailerCosts>,
}

/// The cost headers a gRPC call's trailers may carry, and how to settle them.
struct TrailerCosts {
    meters: SmallVec<[(usize, http::HeaderName); 1]>,
    settle: Arc<SettleFn>,
}

/// One counted policy of a stream: its index in the set, the frame cost, the units
/// reserved and the units counted so far.
type Counter = (usize, Arc<FrameCostFn>, u64, u64);

/// A settlement from the frames of the body.
struct StreamCount {
    counters: SmallVec<[Counter; 1]>,
    settle: Arc<SettleFn>,
    done: bool,
    /// The bytes the body will send, when its head says (`Content-Length`; 0 for a status
    /// that has no body) or its size hint is exact: an HTTP server stops polling a body once
    /// that many are written, so reaching them is its end.
    length: Option<u64>,
    sent: u64,
    /// A switch of protocols (101): what follows is not this body, which never ends here.
    upgrade: bool,
}

/// Applies the route's counting rule to the response head: a response that does not count
/// has its charge refunded, and `decision` (for the headers) shows the units given back.
pub(crate) fn count<B>(
    held: &mut Held,
    res: Response<B>,
    decision: Option<&mut Decision>,
) -> Response<B> {
    let Some(counting) = held.counting.take() else {
        return res;
    };
    if res.status() == http::StatusCode::OK
        && crate::grpc::content_type(res.headers()).is_some()
        && grpc_status(res.headers()).is_none()
    {
        // A gRPC call's outcome comes in its trailers: the body decides (`BodyHold::trailers`).
        // (Another HTTP status with no gRPC one, a proxy's error, is the outcome itself.) A
        // rule over the whole head sees the head's metadata and extensions then, as it does
        // for a call answered trailers-only.
        let mut counting = counting;
        if counting.when.reads_head() {
            counting.head = Some(Box::new((res.headers().clone(), res.extensions().clone())));
        }
        held.counting = Some(counting);
        return res;
    }
    let (head, body) = res.into_parts();
    if !counting.when.counts(&head) {
        if let Some(decision) = decision {
            for &(i, units) in &counting.charged {
                decision.settled(i, units, 0);
            }
        }
        Counting::refund(counting);
    }
    Response::from_parts(head, body)
}

/// Settles what the response head tells (an [`ActualCost`] extension, a cost header, which
/// is removed), adjusts `decision` to the state after the settlement, and returns what the
/// body keeps of `held`: the slots and the frame counters.
pub(crate) fn on_response<B>(
    held: Held,
    res: &mut Response<B>,
    decision: Option<&mut Decision>,
) -> BodyHold {
    let Held {
        slots,
        settlement,
        counting,
    } = held;
    let mut stream = None;
    let mut trailer_costs = None;
    if let Some(settlement) = settlement {
        let mut now: SmallVec<[(usize, u64); 2]> = SmallVec::new();
        let mut counters = SmallVec::new();
        let mut later: SmallVec<[(usize, http::HeaderName); 1]> = SmallVec::new();
        let grpc = crate::grpc::content_type(res.headers()).is_some();
        for m in &settlement.meters {
            match &m.actual {
                Actual::Extension => {
                    let cost = res
                        .extensions()
                        .get::<ActualCost>()
                        .and_then(|a| a.for_policy(&m.name));
                    if let Some(cost) = cost {
                        now.push((m.index, cost));
                    }
                }
                Actual::Header(name) => {
                    let value = res.headers_mut().remove(name);
                    let cost = value
                        .as_ref()
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.trim().parse::<u64>().ok());
                    match cost {
                        Some(cost) => now.push((m.index, cost)),
                        None if value.is_none() && grpc => {
                            later.push((m.index, name.clone()));
                        }
                        None => {}
                    }
                }
                Actual::Stream(count) => counters.push((m.index, Arc::clone(count), m.reserved, 0)),
            }
        }
        if !now.is_empty() {
            (settlement.settle)(&now);
            if let Some(decision) = decision {
                for &(i, actual) in &now {
                    let reserved = settlement
                        .meters
                        .iter()
                        .find(|m| m.index == i)
                        .map_or(actual, |m| m.reserved);
                    decision.settled(i, reserved, actual);
                }
            }
        }
        if !later.is_empty() {
            trailer_costs = Some(TrailerCosts {
                meters: later,
                settle: Arc::clone(&settlement.settle),
            });
        }
        if !counters.is_empty() {
            let no_body = matches!(
                res.status(),
                http::StatusCode::NO_CONTENT | http::StatusCode::NOT_MODIFIED
            );
            let length = if res.status().is_informational() {
                None
            } else if no_body {
                Some(0)
            } else {
                res.headers()
                    .get(http::header::CONTENT_LENGTH)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
            };
            stream = Some(StreamCount {
                counters,
                settle: settlement.settle,
                done: false,
                length,
                sent: 0,
                upgrade: res.status().is_informational(),
            });
        }
    }
    let web = (counting.is_some() || trailer_costs.is_some())
        .then(|| WebTrailers::for_response(res.headers()))
        .flatten();
    BodyHold {
        _slots: slots,
        stream,
        counting,
        web,
        trailer_costs,
    }
}

impl std::fmt::Debug for BodyHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BodyHold")
            .field("slots", &self._slots.is_some())
            .field("counted", &self.stream.is_some())
            .field("awaiting_grpc_status", &self.counting.is_some())
            .finish()
    }
}

impl BodyHold {
    /// Whether the body must be wrapped to keep this.
    pub(crate) fn is_empty(&self) -> bool {
        self._slots.is_none()
            && self.stream.is_none()
            && self.counting.is_none()
            && self.trailer_costs.is_none()
    }

    /// The body's trailers frame: as [`trailers`](Self::trailers), and the cost headers read
    /// from it are removed (meant for the gateway, as from the head).
    pub(crate) fn trailers_mut(&mut self, trailers: &mut http::HeaderMap) {
        let names: SmallVec<[http::HeaderName; 1]> = self
            .trailer_costs
            .iter()
            .flat_map(|t| t.meters.iter().map(|(_, name)| name.clone()))
            .collect();
        self.trailers(trailers);
        for name in &names {
            trailers.remove(name);
        }
    }

    /// The body's trailers: a gRPC call's status, which its counting rule judges (once), and
    /// the costs its metered policies report there (settled once; a body that ends without
    /// them leaves the reservation standing).
    pub(crate) fn trailers(&mut self, trailers: &http::HeaderMap) {
        if let Some(costs) = self.trailer_costs.take() {
            let now: SmallVec<[(usize, u64); 2]> = costs
                .meters
                .iter()
                .filter_map(|(i, name)| {
                    let cost = trailers
                        .get(name)?
                        .to_str()
                        .ok()?
                        .trim()
                        .parse::<u64>()
                        .ok()?;
                    Some((*i, cost))
                })
                .collect();
            if !now.is_empty() {
                (costs.settle)(&now);
            }
        }
        if let Some(mut counting) = self.counting.take() {
            let Some(code) = grpc_status(trailers) else {
                return;
            };
            let counts = match counting.head.take() {
                Some(head) => {
                    let (mut headers, extensions) = *head;
                    for name in trailers.keys() {
                        headers.remove(name);
                    }
                    for (name, value) in trailers {
                        headers.append(name, value.clone());
                    }
                    counting.when.counts_call(code, &headers, Some(&extensions))
                }
                None => counting.when.counts_call(code, trailers, None),
            };
            if !counts {
                counting.refund();
            }
        }
    }

    /// Counts a data frame (and reads a gRPC-Web body's trailers from it).
    pub(crate) fn frame(&mut self, data: &Bytes) {
        if let Some(trailers) = self.web.as_mut().and_then(|web| web.feed(data)) {
            self.web = None;
            self.trailers(&trailers);
        }
        if let Some(stream) = &mut self.stream {
            for (_, count, _, total) in &mut stream.counters {
                *total = total.saturating_add(count(data));
            }
            stream.sent = stream.sent.saturating_add(data.len() as u64);
        }
    }

    /// Learns the body's length before its first frame: 0 when it is already at its end
    /// (`at_end`), else from `hint` (its exact size hint) when its head gave none. A switch
    /// of protocols has none (what follows is not this body).
    pub(crate) fn learn_length(&mut self, at_end: bool, hint: &http_body::SizeHint) {
        if let Some(stream) = self.stream.as_mut().filter(|s| !s.upgrade) {
            if at_end {
                stream.length = Some(0);
            } else if stream.length.is_none() {
                stream.length = hint.exact();
            }
        }
    }

    /// The body ended: settles what was counted (once).
    pub(crate) fn end(&mut self) {
        self.settle_counted(false);
    }

    /// Settles the stream once: at what was counted, or, for a body dropped before its end,
    /// at no less than what was reserved (the frames not yet sent may have been paid for
    /// upstream).
    fn settle_counted(&mut self, cut_short: bool) {
        if let Some(stream) = &mut self.stream {
            if !stream.done {
                stream.done = true;
                let totals: SmallVec<[(usize, u64); 2]> = stream
                    .counters
                    .iter()
                    .map(|&(i, _, reserved, counted)| {
                        (
                            i,
                            if cut_short {
                                counted.max(reserved)
                            } else {
                                counted
                            },
                        )
                    })
                    .collect();
                (stream.settle)(&totals);
            }
        }
    }
}

/// A body dropped before its end (the client hung up, a stream reset) is settled with the
/// frames counted so far, so a client cannot pay only the estimate for a long stream by
/// hanging up before it ends. One dropped once its whole length was sent has ended: an HTTP
/// server stops polling a body after its last byte, and never polls an empty one.
impl Drop for BodyHold {
    fn drop(&mut self) {
        let sent_whole = self
            .stream
            .as_ref()
            .is_some_and(|s| s.length.is_some_and(|length| s.sent >= length));
        self.settle_counted(!sent_whole);
    }
}
