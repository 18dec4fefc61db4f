//! [`LoginOutcome`]: what a login route's response says about the attempt.

use http::StatusCode;

#[cfg(doc)]
use super::LoginGuard;

/// What a login route's response says about the attempt; see [`LoginLayer::classify`](super::LoginLayer::classify).
///
/// ```
/// use http::StatusCode;
/// use tollgate::login::LoginOutcome;
///
/// assert_eq!(LoginOutcome::from_status(StatusCode::OK), LoginOutcome::Success);
/// assert_eq!(LoginOutcome::from_status(StatusCode::UNAUTHORIZED), LoginOutcome::Failure);
/// assert_eq!(LoginOutcome::from_status(StatusCode::BAD_REQUEST), LoginOutcome::Unknown);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LoginOutcome {
    /// The password was right: [`LoginGuard::record_success`].
    Success,
    /// The password was wrong: [`LoginGuard::record_failure`].
    Failure,
    /// Neither (a malformed request, a server error): nothing is recorded, so the attempt
    /// keeps what [`LoginGuard::check`] charged and counts as a failure (see
    /// [`LoginMode`](super::LoginMode)).
    Unknown,
}

impl LoginOutcome {
    /// The default classification: 2xx is a success, 401 and 403 are failures, anything else
    /// is unknown.
    pub fn from_status(status: StatusCode) -> Self {
        if status.is_success() {
            LoginOutcome::Success
        } else if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            LoginOutcome::Failure
        } else {
            LoginOutcome::Unknown
        }
    }
}
