//! How a call is counted: under which key, how many permits it takes before it is sent, and
//! what it turned out to cost once its response came.
//!
//! A cost known only from the response (the tokens of an LLM API) is reserved as an estimate
//! before the call and settled where the response future gets the response, which keeps the
//! call's [`Decision`](crate::decision::Decision) until then: see
//! [`Limiter::settle`](crate::Limiter::settle).

use std::fmt;
use std::sync::Arc;

use crate::sync::{lock, unpoisoned, Mutex};

/// Chooses the limiter key of an outbound request; implemented for closures `Fn(&Req) -> K`
/// and for `()`, one key for every call (the whole dependency shares one quota, the default).
pub trait QuotaKey<Req> {
    /// The key handed to the limiter.
    type Key;

    /// The key of `request`.
    fn key(&self, request: &Req) -> Self::Key;
}

impl<Req, K, F: Fn(&Req) -> K> QuotaKey<Req> for F {
    type Key = K;

    fn key(&self, request: &Req) -> K {
        self(request)
    }
}

impl<Req> QuotaKey<Req> for () {
    type Key = ();

    fn key(&self, _: &Req) {}
}

/// Chooses how many permits an outbound request costs; implemented for closures
/// `Fn(&Req) -> u32` and for `u32`, the same cost for every call (one by default).
pub trait QuotaCost<Req> {
    /// The permits `request` takes.
    fn cost(&self, request: &Req) -> u32;
}

impl<Req, F: Fn(&Req) -> u32> QuotaCost<Req> for F {
    fn cost(&self, request: &Req) -> u32 {
        self(request)
    }
}

impl<Req> QuotaCost<Req> for u32 {
    fn cost(&self, _: &Req) -> u32 {
        *self
    }
}

/// What a call turned out to cost, read from its response: implemented for closures
/// `Fn(&Resp) -> Option<u32>`, for [`SettleLater`], and for `()`, the cost asked for stands
/// (the default).
pub trait QuotaSettle<Resp> {
    /// Whether the response carries an [`Unsettled`] in its extensions when
    /// [`settled`](Self::settled) says nothing.
    const LATER: bool = false;

    /// The cost `response` reports, or `None` if it says nothing readable (the estimate
    /// stands).
    fn settled(&self, response: &Resp) -> Option<u32>;

    /// Leaves `unsettled` with `response`, when [`LATER`](Self::LATER) says so.
    fn leave(&self, response: &mut Resp, unsettled: Unsettled) {
        let _ = (response, unsettled);
    }
}

impl<Resp, F: Fn(&Resp) -> Option<u32>> QuotaSettle<Resp> for F {
    fn settled(&self, response: &Resp) -> Option<u32> {
        self(response)
    }
}

impl<Resp> QuotaSettle<Resp> for () {
    fn settled(&self, _: &Resp) -> Option<u32> {
        None
    }
}

/// Settles a call once its response body has been read ([`ClientQuotaLayer::settle_by`](
/// super::ClientQuotaLayer::settle_by)`(SettleLater)`): each response carries an [`Unsettled`]
/// in its extensions (`http::Response` and `reqwest::Response` have them; see
/// [`ResponseHead::extensions_mut`](crate::head::ResponseHead::extensions_mut)), which the caller settles to the cost the body reports
/// (an LLM API's `usage.total_tokens`; [`UsageScan`](crate::usage::UsageScan) reads it as
/// the body streams).
#[derive(Clone, Copy, Debug, Default)]
pub struct SettleLater;

impl<Resp: crate::head::ResponseHead> QuotaSettle<Resp> for SettleLater {
    const LATER: bool = true;

    fn settled(&self, _: &Resp) -> Option<u32> {
        None
    }

    fn leave(&self, response: &mut Resp, unsettled: Unsettled) {
        // A response without extensions keeps its estimate.
        if let Some(extensions) = response.extensions_mut() {
            extensions.insert(unsettled);
        }
    }
}

/// The settle of a call that its response's body will tell: take it from the response's
/// extensions and [`settle`](Self::settle) it once the cost is known. Dropped (every clone of
/// it) unsettled, the call's estimate stands.
#[derive(Clone)]
pub struct Unsettled(Arc<Pending>);

/// What settles one call, given its cost (`None`: the estimate stands).
type SettleWith = Box<dyn FnOnce(Option<u32>) + Send>;

/// The settle of a call not made yet; dropped so (with the last clone of its [`Unsettled`]), it
/// runs with the estimate standing, which a limiter holding the estimate until the settle
/// ([`Metered`](crate::algorithm::Metered)) needs to hear.
struct Pending(Mutex<Option<SettleWith>>);

impl Drop for Pending {
    fn drop(&mut self) {
        let settle = unpoisoned(self.0.get_mut()).take();
        if let Some(settle) = settle {
            settle(None);
        }
    }
}

impl Unsettled {
    /// A settle that runs `settle` once: with the cost, or with `None` when every clone is
    /// dropped unsettled.
    pub(super) fn new(settle: impl FnOnce(Option<u32>) + Send + 'static) -> Self {
        Self(Arc::new(Pending(Mutex::new(Some(Box::new(settle))))))
    }

    /// Settles the call to `cost`, as [`Limiter::settle`](crate::Limiter::settle) does. Only the
    /// first settle of a call counts (clones share it): returns whether this one did.
    pub fn settle(&self, cost: u32) -> bool {
        let settle = lock(&self.0 .0).take();
        settle.map(|settle| settle(Some(cost))).is_some()
    }
}

impl fmt::Debug for Unsettled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let open = lock(&self.0 .0).is_some();
        f.debug_struct("Unsettled").field("open", &open).finish()
    }
}
