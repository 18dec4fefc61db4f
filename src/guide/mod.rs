//! Guides: the reasoning behind a part of tollgate, longer than its item docs should be.
//!
//! Documentation only; nothing here is code.
//!
//! * [`login`]: the login guard's counting modes, the lockout trade-off, usernames and stores.

pub mod login;
