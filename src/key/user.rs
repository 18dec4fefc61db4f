//! [`User`]: the authenticated principal an auth layer left in the request extensions.

use std::fmt;
use std::marker::PhantomData;

use compact_str::{CompactString, ToCompactString};

use super::{Key, KeyExtractor, RequestView};

/// The authenticated user: the value of type `T` that an auth layer inserted into the request
/// extensions, rendered with its `Display` impl. Key `user:<id>` (the source name can be
/// changed with [`User::source`]).
///
/// A request without a `T` (not authenticated) yields no key, so put `User` first in a
/// [`Chain`](super::Chain) and let the next extractor key the anonymous traffic. Add the auth
/// layer *outside* the rate-limit layer (in axum, `.layer(rate_limit).layer(auth)`: the last
/// layer added runs first) so the principal is there when the key is taken. Short ids are
/// formatted without allocating.
///
/// For a principal that needs more than `Display` (a field of a claims struct, a header the
/// auth layer wrote), use [`User::from_fn`].
///
/// ```
/// use std::fmt;
/// use tollgate::key::{KeyExtractor, RequestView, User};
///
/// #[derive(Clone)]
/// struct UserId(u64);
/// impl fmt::Display for UserId {
///     fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { self.0.fmt(f) }
/// }
///
/// let extractor = User::<UserId>::new();
/// let mut req = http::Request::new(());
/// assert!(extractor.extract(&RequestView::new(&req)).is_none());
/// req.extensions_mut().insert(UserId(42));
/// assert_eq!(extractor.extract(&RequestView::new(&req)).unwrap().as_str(), "user:42");
/// ```
pub struct User<T> {
    source: CompactString,
    principal: PhantomData<fn() -> T>,
}

impl<T> User<T>
where
    T: fmt::Display + Send + Sync + 'static,
{
    /// Reads a `T` from the extensions; key source `user`.
    pub fn new() -> Self {
        Self {
            source: CompactString::const_new("user"),
            principal: PhantomData,
        }
    }
}

impl User<()> {
    /// The principal computed by a closure over the request; `None` means no user.
    ///
    /// ```
    /// use tollgate::key::{KeyExtractor, RequestView, User};
    ///
    /// #[derive(Clone)]
    /// struct Claims { sub: String, tenant: String }
    ///
    /// let extractor = User::from_fn(|req: &RequestView<'_>| {
    ///     req.extensions().get::<Claims>().map(|c| format!("{}/{}", c.tenant, c.sub))
    /// });
    /// let mut req = http::Request::new(());
    /// req.extensions_mut().insert(Claims { sub: "ann".into(), tenant: "acme".into() });
    /// assert_eq!(extractor.extract(&RequestView::new(&req)).unwrap().as_str(), "user:acme/ann");
    /// ```
    pub fn from_fn<F, D>(f: F) -> UserFn<F>
    where
        F: Fn(&RequestView<'_>) -> Option<D> + Send + Sync + 'static,
        D: fmt::Display,
    {
        UserFn {
            source: CompactString::const_new("user"),
            f,
        }
    }
}

impl<T> User<T> {
    /// The key source (default `user`), e.g. `tenant` or `account`.
    ///
    /// ```
    /// use tollgate::key::{KeyExtractor, RequestView, User};
    ///
    /// let mut req = http::Request::new(());
    /// req.extensions_mut().insert(String::from("acme"));
    /// let key = User::<String>::new().source("tenant").extract(&RequestView::new(&req));
    /// assert_eq!(key.unwrap().as_str(), "tenant:acme");
    /// ```
    pub fn source(mut self, source: &str) -> Self {
        self.source = source.into();
        self
    }
}

impl<T> Clone for User<T> {
    fn clone(&self) -> Self {
        Self {
            source: self.source.clone(),
            principal: PhantomData,
        }
    }
}

impl<T> fmt::Debug for User<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("User")
            .field("principal", &std::any::type_name::<T>())
            .field("source", &self.source)
            .finish()
    }
}

impl<T> Default for User<T>
where
    T: fmt::Display + Send + Sync + 'static,
{
    fn default() -> Self {
        Self::new()
    }
}

impl<T> KeyExtractor for User<T>
where
    T: fmt::Display + Send + Sync + 'static,
{
    fn extract(&self, request: &RequestView<'_>) -> Option<Key> {
        let principal = request.extensions().get::<T>()?;
        Some(Key::new(&self.source, principal.to_compact_string()))
    }
}

/// A user principal computed by a closure; see [`User::from_fn`].
#[derive(Clone)]
pub struct UserFn<F> {
    source: CompactString,
    f: F,
}

impl<F> UserFn<F> {
    /// The key source (default `user`).
    pub fn source(mut self, source: &str) -> Self {
        self.source = source.into();
        self
    }
}

impl<F> fmt::Debug for UserFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UserFn")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl<F, D> KeyExtractor for UserFn<F>
where
    F: Fn(&RequestView<'_>) -> Option<D> + Send + Sync + 'static,
    D: fmt::Display,
{
    fn extract(&self, request: &RequestView<'_>) -> Option<Key> {
        let principal = (self.f)(request)?;
        Some(Key::new(&self.source, principal.to_compact_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone)]
    struct Uid(&'static str);
    impl fmt::Display for Uid {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    #[test]
    fn hostile_principal_is_escaped_and_sourced() {
        let mut req = http::Request::new(());
        req.extensions_mut().insert(Uid("a {b}\n"));
        let key = User::<Uid>::new().extract(&RequestView::new(&req)).unwrap();
        assert_eq!(key.as_str(), "user:a%20%7Bb%7D%0A");
        assert_eq!(key.source(), "user");
        assert!(format!("{:?}", User::<Uid>::new()).contains("Uid"));
    }

    #[test]
    fn closure_none_means_no_user() {
        let ex = User::from_fn(|_: &RequestView<'_>| None::<u64>).source("acct");
        assert!(ex
            .extract(&RequestView::new(&http::Request::new(())))
            .is_none());
        let ex = User::from_fn(|_: &RequestView<'_>| Some(7u64)).source("acct");
        let key = ex.extract(&RequestView::new(&http::Request::new(())));
        assert_eq!(key.unwrap().as_str(), "acct:7");
    }
}
