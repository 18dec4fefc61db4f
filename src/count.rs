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
    /// For a gRPC call whose status comes in the trailers, `f` is asked when they arrive,
    /// with the status's HTTP equivalent, the head's headers (the initial metadata) with the
    /// trailers over them, and the head's extensions: the same view as for a call answered
    /// trailers-only.
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
    ///
    /// **gRPC.** A gRPC call is answered HTTP 200 whatever its outcome, which travels in
    /// `grpc-status`. So for a gRPC response (its `Content-Type` is gRPC, see
    /// [`grpc::content_type`](crate::grpc::content_type)) the rule reads the call's status
    /// instead of the HTTP one, as [`counts_grpc`](Self::counts_grpc) does: from the head of a
    /// trailers-only response (how tonic answers an error). A gRPC head of HTTP 200 without
    /// `grpc-status` does not know the outcome yet (it comes in the trailers), so it counts
    /// here, but for a rule over the whole head, which is asked with the head as it is; the
    /// layer waits for the trailers instead, and the direct API calls
    /// [`Reservation::count_grpc`](crate::Reservation::count_grpc) with the status. One of
    /// another HTTP status and no `grpc-status` (a proxy's error page) is judged by its HTTP
    /// status, as gRPC clients read it.
    ///
    /// ```
    /// use tollgate::route::CountWhen;
    ///
    /// // tonic's answer to `Err(Status::unauthenticated(..))`: HTTP 200, grpc-status 16.
    /// let (head, ()) = http::Response::builder()
    ///     .header("content-type", "application/grpc")
    ///     .header("grpc-status", "16")
    ///     .body(())
    ///     .unwrap()
    ///     .into_parts();
    /// assert!(CountWhen::failures().counts(&head));
    /// assert!(!CountWhen::successes().counts(&head));
    /// ```
    pub fn counts(&self, head: &Parts) -> bool {
        if crate::grpc::content_type(&head.headers).is_some() {
            if let Some(code) = grpc_status(&head.headers) {
                return self.counts_call(code, &head.headers, Some(&head.extensions));
            }
            if head.status == StatusCode::OK && !matches!(self.rule, Rule::Head(_)) {
                return true;
            }
        }
        match &self.rule {
            Rule::Head(f) => f(head),
            _ => self.counts_status(head.status),
        }
    }

    /// Whether a gRPC call that ended with status `code` (`0` is `OK`) counts. The rule
    /// judges the code's HTTP equivalent, as the gRPC gateways map them: `OK` is 200,
    /// `INVALID_ARGUMENT`, `FAILED_PRECONDITION` and `OUT_OF_RANGE` 400, `UNAUTHENTICATED`
    /// 401, `PERMISSION_DENIED` 403, `NOT_FOUND` 404, `ALREADY_EXISTS` and `ABORTED` 409,
    /// `RESOURCE_EXHAUSTED` 429, `CANCELLED` 499, `UNIMPLEMENTED` 501, `UNAVAILABLE` 503,
    /// `DEADLINE_EXCEEDED` 504, and `UNKNOWN`, `INTERNAL`, `DATA_LOSS` and any other code 500.
    /// So [`failures`](Self::failures) counts every code but `OK`. A rule over the whole head
    /// ([`from_fn`](Self::from_fn)) is given a head with that status and a `grpc-status`
    /// header.
    ///
    /// ```
    /// use tollgate::route::CountWhen;
    ///
    /// assert!(!CountWhen::failures().counts_grpc(0)); // OK
    /// assert!(CountWhen::failures().counts_grpc(16)); // UNAUTHENTICATED
    /// assert!(CountWhen::statuses(["401", "403"])?.counts_grpc(7)); // PERMISSION_DENIED
    /// assert!(!CountWhen::statuses(["5xx"])?.counts_grpc(5)); // NOT_FOUND
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn counts_grpc(&self, code: i32) -> bool {
        let mut headers = http::HeaderMap::new();
        if let Ok(value) = http::HeaderValue::try_from(code.to_string()) {
            headers.insert(GRPC_STATUS.clone(), value);
        }
        self.counts_call(code, &headers, None)
    }

    /// Whether the rule reads the whole response head ([`from_fn`](Self::from_fn)).
    pub(crate) fn reads_head(&self) -> bool {
        matches!(self.rule, Rule::Head(_))
    }

    /// The rule for a gRPC call that ended with `code`, whose status arrived in `headers`
    /// (a trailers-only head, or the trailers).
    pub(crate) fn counts_call(
        &self,
        code: i32,
        headers: &http::HeaderMap,
        extensions: Option<&http::Extensions>,
    ) -> bool {
        let status = grpc_http_equivalent(code);
        if let Rule::Head(f) = &self.rule {
            let (mut head, ()) = http::Response::new(()).into_parts();
            head.status = status;
            head.headers = headers.clone();
            if let Some(extensions) = extensions {
                head.extensions = extensions.clone();
            }
            return f(&head);
        }
        self.counts_status(status)
    }

    /// The rule for a response of status `status_code`; a whole-head rule is asked by the
    /// callers, which have the head.
    fn counts_status(&self, status_code: StatusCode) -> bool {
        let status = status_code.as_u16();
        match &self.rule {
            Rule::Failures => status >= 400,
            Rule::Successes => status < 400,
            Rule::Statuses { classes, exact } => {
                let class = status / 100;
                (1..=5).contains(&class) && classes & (1 << class) != 0 || exact.contains(&status)
            }
            Rule::Status(f) => f(status_code),
            Rule::Head(_) => true,
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

static GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");

/// The status of a gRPC call in `headers` (a trailers-only head, or the trailers): `None`
/// when there is none, `UNKNOWN` (2) when it is not a number, as a gRPC client reads it.
pub(crate) fn grpc_status(headers: &http::HeaderMap) -> Option<i32> {
    let value = headers.get(&GRPC_STATUS)?;
    Some(
        std::str::from_utf8(value.as_bytes())
            .ok()
            .and_then(|v| v.trim().parse::<i32>().ok())
            .unwrap_or(2),
    )
}

/// The HTTP status a gRPC status code stands for, as the gRPC gateways map them.
pub(crate) fn grpc_http_equivalent(code: i32) -> StatusCode {
    let status = match code {
        0 => 200,
        3 | 9 | 11 => 400,
        16 => 401,
        7 => 403,
        5 => 404,
        6 | 10 => 409,
        8 => 429,
        1 => 499,
        12 => 501,
        14 => 503,
        4 => 504,
        _ => 500,
    };
    StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
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

    fn grpc_head(status: Option<&str>) -> http::response::Parts {
        let mut b = http::Response::builder().header("content-type", "application/grpc+proto");
        if let Some(status) = status {
            b = b.header("grpc-status", status);
        }
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn a_grpc_head_is_judged_by_its_call_status() {
        let failures = CountWhen::failures();
        let successes = CountWhen::successes();
        assert!(!failures.counts(&grpc_head(Some("0"))));
        assert!(successes.counts(&grpc_head(Some("0"))));
        for code in 1..=16 {
            let head = grpc_head(Some(&code.to_string()));
            assert!(failures.counts(&head), "code {code}");
            assert!(!successes.counts(&head), "code {code}");
            assert_eq!(failures.counts_grpc(code), failures.counts(&head));
        }
        // Garbage is UNKNOWN, as a gRPC client reads it: a failure.
        assert!(failures.counts(&grpc_head(Some("zero"))));
        assert!(!successes.counts(&grpc_head(Some("-"))));
        // No status yet (it comes in the trailers): the outcome is unknown, so it counts.
        assert!(failures.counts(&grpc_head(None)));
        assert!(successes.counts(&grpc_head(None)));
        // An HTTP error with no gRPC status (a proxy's 503) is judged by its HTTP status.
        let mut proxied = grpc_head(None);
        proxied.status = http::StatusCode::SERVICE_UNAVAILABLE;
        assert!(failures.counts(&proxied));
        assert!(!successes.counts(&proxied));
        // A whole-head rule is asked with the head as it is when it holds no status.
        let marked = CountWhen::from_fn(|h| h.headers.contains_key("x-counted"));
        assert!(!marked.counts(&grpc_head(None)));
        // A whole-head rule sees the code's HTTP equivalent and the status header.
        let custom = CountWhen::from_fn(|h| {
            h.status == http::StatusCode::UNAUTHORIZED && h.headers["grpc-status"] == "16"
        });
        assert!(custom.counts_grpc(16));
        assert!(custom.counts(&grpc_head(Some("16"))));
        assert!(!custom.counts_grpc(7));
        // Any status list applies to the equivalents; an HTTP 200 head of another type is HTTP.
        let list = CountWhen::statuses(["429", "5xx"]).unwrap();
        assert!(list.counts_grpc(8) && list.counts_grpc(14) && list.counts_grpc(99));
        assert!(!list.counts_grpc(5) && !list.counts_grpc(0));
        assert!(!failures.counts(&head(200)));
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
