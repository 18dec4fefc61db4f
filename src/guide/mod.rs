//! Guides: the reasoning behind a part of tollgate, longer than its item docs should be.
//!
//! Documentation only; nothing here is code.
//!
//! * [`glossary`]: the words of tollgate — slot, hold, reservation, settlement, lease, block,
//!   and the rest — each with one meaning.
//! * [`login`]: the login guard's counting modes, the lockout trade-off, usernames and stores.

pub mod glossary;
pub mod login;
