//! How long the keys the scripts write live: a margin after their state stops mattering, on
//! a grid.

/// How long a key outlives the moment its state stops mattering, in milliseconds, before
/// its expiry is rounded up to the grid of [`TTL_GRID_MS`].
///
/// `expires_at` is the same instant [`crate::algorithm`] computes for the memory store. The
/// key of a sliding window log or in-flight state gets `PEXPIRE (expires_at − now) +
/// TTL_MARGIN_MS`. The key of a counter, token bucket, fixed window or GCRA state expires at
/// the first multiple of [`TTL_GRID_MS`] at or after `expires_at + TTL_MARGIN_MS`: at least
/// `TTL_MARGIN_MS − TTL_GRID_MS` (488 ms) and less than `TTL_MARGIN_MS + TTL_GRID_MS`
/// (1 512 ms) after its state stops mattering. A write whose state's expiry stays in the
/// same cell of that grid keeps the key's TTL (`SET … KEEPTTL`) instead of setting a new one:
/// for GCRA, whose expiry moves by the emission interval with each charged request, while
/// that interval times the cost is under half a second; for the token bucket while its
/// deficit refills in about that.
///
/// Both bounds are on the script's clock (`TIME`); Redis counts a TTL from its own time for
/// the command, which can differ from it by about a millisecond, well inside the lower
/// bound's 488 ms. With an injected clock, the bounds hold only while that clock runs at
/// Redis's rate (a frozen test clock does not).
///
/// A token bucket's state matters until its deficit is refilled, which depends on its
/// limit, and the limit can change without a write. Under a per-key override the key is
/// kept for the slower of the override's and the plan's rates (the override can end, by
/// its TTL or removal, with nothing written), and setting an override extends the key's
/// TTL to what the override's rate needs; the memory store keeps its entries the same way.
/// So a key outlives the upper bound by the slower rate's refill while an override that
/// raised the limit is in force. Not covered, until the key's next charge: a reload that
/// lowers a bucket's limit (in either store: the memory store's sweeper forgets entries by
/// the same expiry), an override set by an instance of an earlier version (a plain `SET`),
/// and an override that raised the limit being removed when the key was last written by an
/// earlier version's script (its TTL followed the override's rate alone). In each, a key
/// whose deficit the faster rate would have refilled can expire while the slower one would
/// still hold the bucket back.
pub const TTL_MARGIN_MS: u64 = 1_000;

/// The step of the grid on which the keys of string states expire, in milliseconds: see
/// [`TTL_MARGIN_MS`]. At most `TTL_MARGIN_MS`, so a key never expires before its state stops
/// mattering, and a power of two, so the script's rounding is exact in doubles.
pub const TTL_GRID_MS: u64 = 512;
