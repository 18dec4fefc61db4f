//! Conditional counting: which responses count against a route's rate policies
//! ([`CountWhen`]), and the checks a route with a counting rule must pass when it is built.

use std::fmt;
use std::sync::Arc;

use http::response::Parts;
use http::StatusCode;

use crate::error::ConfigError;
use crate::policy::Policy;

/// Decides from a response head whether a request counts.
type CountFn = dyn Fn(&Parts) -> bool + Send + Sync;

/// Which requests of a route count against its rate policies, decided from the response
/// head: only failures, only successes, some status classes, or your own rule
/// ([`Route::count_when`](crate::route::Route::count_when)).
///
/// **Race-free.** A request is charged (held) when it is admitted, like any other, and the
/// charge is refunded ([`Op::Refund`](crate::store::Op::Refund)) when its response head
/// says it does not count. So a request that will turn out not to count still holds its
/// unit while it runs: with a limit of N, at most N requests are in flight or counted per
/// window, and a burst of N slow requests refuses the N+1th, whatever their responses turn
/// out to be. (Counting at request time and uncounting afterwards without holding, or
/// deciding only after the response, lets any number of concurrent requests through.)
///
/// **What counts when no response head comes**: an inner service error, a panic, a response
/// future dropped before the head (a client gone, a timeout) all count: the charge stands.
/// A refused request is charged nothing, as always.
///
/// Only the enforced rate policies are refunded: an [in-flight](crate::Algorithm::InFlight)
/// policy's slot comes back when the response ends, as always, and
/// [shadow](crate::PolicyBuilder::shadow) policies count every admitted request.
///
/// # Examples
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use std::convert::Infallible;
/// use http::{Request, Response, StatusCode};
/// use tollgate::key::Global;
/// use tollgate::route::{CountWhen, Route};
/// use tollgate::{Limiter, Policy, Rate, RateLimitLayer};
/// use tower::{Service, ServiceBuilder, ServiceExt};
///
/// // Two failed calls a minute; successful ones are not counted.
/// let limiter = Limiter::builder()
///     .default_route(Route::new()
///         .policy(Policy::new("failures", Rate::per_minute(2))?)
///         .count_when(CountWhen::failures()))
///     .extractor(Global::new())
///     .build()?;
/// let mut svc = ServiceBuilder::new()
///     .layer(RateLimitLayer::new(limiter))
///     .service_fn(|req: Request<String>| async move {
///         let status = if req.uri().path() == "/ok" { StatusCode::OK } else { StatusCode::NOT_FOUND };
///         Ok::<_, Infallible>(Response::builder().status(status).body(String::new()).unwrap())
///     });
/// for _ in 0..5 {
///     let res = svc.ready().await?.call(Request::get("/ok").body(String::new())?).await?;
///     assert_eq!(res.status(), StatusCode::OK);
/// }
/// for _ in 0..2 {
///     let res = svc.ready().await?.call(Request::get("/nope").body(String::new())?).await?;
///     assert_eq!(res.status(), StatusCode::NOT_FOUND);
/// }
/// let res = svc.ready().await?.call(Request::get("/ok").body(String::new())?).await?;
/// assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
///
/// A custom rule over the whole head:
///
/// ```
/// use tollgate::route::CountWhen;
///
/// // Count what the backend says was expensive.
/// let when = CountWhen::from_fn(|head| head.status.is_server_error()
///     || head.headers.contains_key("x-expensive"));
/// ```
#[derive(Clone)]
pub struct CountWhen {
    rule: Rule,
}

#[derive(Clone)]
enum Rule {
    /// Statuses 400 to 599.
    Failures,
    /// Statuses below 400.
    Successes,
    /// Statuses whose class (the first digit) is in this bit set, or listed exactly.
    Statuses {
        classes: u8,
        exact: Arc<[u16]>,
    },
    Status(Arc<dyn Fn(StatusCode) -> bool + Send + Sync>),
    Head(Arc<CountFn>),
}

impl fmt::Debug for CountWhen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.rule {
            Rule::Failures => f.write_str("CountWhen::failures()"),
            Rule::Successes => f.write_str("CountWhen::successes()"),
            Rule::Statuses { .. } => write!(f, "CountWhen::statuses({:?})", self.describe()),
            Rule::Status(_) => f.write_str("CountWhen::status(..)"),
            Rule::Head(_) => f.write_str("CountWhen::from_fn(..)"),
        }
    }
}

impl CountWhen {
    /// Counts failures only: responses with a status of 400 or above (what express-rate-limit
    /// calls a failed request). A successful login, search or upload is refunded.
    pub fn failures() -> Self {
        Self {
            rule: Rule::Failures,
        }
    }

    /// Counts successes only: responses with a status below 400. A request the service
    /// answers with an error is refunded.
    pub fn successes() -> Self {
        Self {
            rule: Rule::Successes,
        }
    }

    /// Counts the responses whose status `f` accepts.
    ///
    /// ```
    /// use tollgate::route::CountWhen;
    ///
    /// // Count everything but "not found".
    /// let when = CountWhen::status(|s| s != http::StatusCode::NOT_FOUND);
    /// ```
    pub fn status<F>(f: F) -> Self
    where
        F: Fn(StatusCode) -> bool + Send + Sync + 'static,
    {
        Self {
            rule: Rule::Status(Arc::new(f)),
        }
    }

    /// Counts the responses whose status is in one of `statuses`: classes (`"2xx"` to
    /// `"5xx"`) or exact codes (`"404"`), as a plan's `count = ["4xx", "5xx"]` says.
    ///
    /// ```
    /// use tollgate::route::CountWhen;
    ///
    /// let when = CountWhen::statuses(["429", "5xx"])?;
    /// assert!(CountWhen::statuses(["6xx"]).is_err());
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for field `count` naming a value that is neither a class `1xx` to
    /// `5xx` nor a status code from 100 to 599, or for an empty list.
    pub fn statuses<I>(statuses: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let mut classes = 0u8;
        let mut exact = Vec::new();
        for s in statuses {
            let s = s.as_ref().trim();
            let class = s
                .strip_suffix("xx")
                .or_else(|| s.strip_suffix("XX"))
                .and_then(|d| d.parse::<u8>().ok());
            match (class, s.parse::<u16>()) {
                (Some(c @ 1..=5), _) => classes |= 1 << c,
                (None, Ok(code @ 100..=599)) => exact.push(code),
                _ => {
                    return Err(ConfigError::new(
                        "count",
                        format_args!("{s:?}"),
                        "not a status class (\"1xx\" to \"5xx\") or a status code (100 to 599); \
                         use \"failures\", \"successes\" or a list such as [\"4xx\", \"5xx\"]",
                    ))
                }
            }
        }
        if classes == 0 && exact.is_empty() {
            return Err(ConfigError::new(
                "count",
                "[]",
                "an empty list would count nothing; list status classes or codes",
            ));
        }
        Ok(Self {
            rule: Rule::Statuses {
                classes,
                exact: exact.into(),
            },
        })
    }

    /// Counts the responses whose head (status, headers, extensions) `f` accepts.
    ///
    /// ```
    /// use tollgate::route::CountWhen;
    ///
    /// // The handler marks the responses that count.
    /// #[derive(Clone)]
    /// struct Counted;
    /// let when = CountWhen::from_fn(|head| head.extensions.get::<Counted>().is_some());
    /// ```
    pub fn from_fn<F>(f: F) -> Self
    where
        F: Fn(&Parts) -> bool + Send + Sync + 'static,
    {
        Self {
            rule: Rule::Head(Arc::new(f)),
        }
    }

    /// Whether a request whose response head is `head` counts.
    ///
    /// ```
    /// use tollgate::route::CountWhen;
    ///
    /// let (head, ()) = http::Response::builder().status(503).body(()).unwrap().into_parts();
    /// assert!(CountWhen::failures().counts(&head));
    /// assert!(!CountWhen::successes().counts(&head));
    /// ```
    pub fn counts(&self, head: &Parts) -> bool {
        let status = head.status.as_u16();
        match &self.rule {
            Rule::Failures => status >= 400,
            Rule::Successes => status < 400,
            Rule::Statuses { classes, exact } => {
                let class = status / 100;
                (1..=5).contains(&class) && classes & (1 << class) != 0 || exact.contains(&status)
            }
            Rule::Status(f) => f(head.status),
            Rule::Head(f) => f(head),
        }
    }

    /// The rule in a plan's words, for the audit: `failures`, `successes`, a status list, or
    /// `custom`.
    pub(crate) fn describe(&self) -> String {
        match &self.rule {
            Rule::Failures => "failures".to_owned(),
            Rule::Successes => "successes".to_owned(),
            Rule::Statuses { classes, exact } => {
                let mut parts: Vec<String> = (1..=5u8)
                    .filter(|c| classes & (1 << c) != 0)
                    .map(|c| format!("{c}xx"))
                    .collect();
                parts.extend(exact.iter().map(u16::to_string));
                parts.join(", ")
            }
            Rule::Status(_) | Rule::Head(_) => "custom".to_owned(),
        }
    }
}

/// Checks a counting rule against the route it is on: each of its policy sets (`sets`, the
/// untiered policies and each tier's) needs an enforced rate policy to refund, and the
/// route no [metered](crate::route::Route::metered) policies (whose reservation is settled
/// instead). `field` and `here` name the route in the error.
pub(crate) fn check_route<'a>(
    count: Option<&CountWhen>,
    (field, here): (&str, &str),
    mut sets: impl Iterator<Item = &'a [Policy]>,
    metered: bool,
) -> Result<(), ConfigError> {
    let Some(count) = count else {
        return Ok(());
    };
    let field = if field.is_empty() {
        "count".to_owned()
    } else {
        format!("{field}.count")
    };
    let rate = |p: &Policy| !p.is_in_flight() && !p.is_shadow();
    if sets.any(|policies| !policies.iter().any(rate)) {
        return Err(ConfigError::new(
            field,
            count.describe(),
            format!(
                "{here} has a counting rule but no rate policy to count against (in-flight \
                 and shadow policies are not refunded); give it a rate policy"
            ),
        ));
    }
    if metered {
        return Err(ConfigError::new(
            field,
            count.describe(),
            format!(
                "{here} has both a counting rule and metered policies; a metered policy \
                 settles its actual cost instead (settle at 0 for a request that does not count)"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::CountWhen;

    fn head(status: u16) -> http::response::Parts {
        http::Response::builder()
            .status(status)
            .body(())
            .unwrap()
            .into_parts()
            .0
    }

    #[test]
    fn failures_and_successes_split_at_400() {
        for (status, failure) in [
            (200, false),
            (302, false),
            (399, false),
            (400, true),
            (503, true),
        ] {
            assert_eq!(
                CountWhen::failures().counts(&head(status)),
                failure,
                "{status}"
            );
            assert_eq!(
                CountWhen::successes().counts(&head(status)),
                !failure,
                "{status}"
            );
        }
    }

    #[test]
    fn statuses_take_classes_and_codes_and_refuse_the_rest() {
        let when = CountWhen::statuses(["5xx", "429"]).unwrap();
        assert!(when.counts(&head(500)) && when.counts(&head(429)));
        assert!(!when.counts(&head(404)) && !when.counts(&head(200)));
        assert_eq!(when.describe(), "5xx, 429");
        for bad in ["6xx", "0xx", "600", "4x", "failures", ""] {
            let err = CountWhen::statuses([bad]).unwrap_err();
            assert_eq!(err.field(), "count", "{bad}");
        }
        assert!(CountWhen::statuses(Vec::<String>::new()).is_err());
    }
}
