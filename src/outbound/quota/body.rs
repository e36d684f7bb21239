//! A client quota settled from the answer's body as it streams to the caller (feature
//! `reqwest`): the call's estimate goes to the cost a [`BodyUsage`] reads, as an inbound
//! policy's [`settle_from_body`](crate::rate_limit::Policy::settle_from_body) does.

use reqwest::ResponseBuilderExt;

use super::counting::{QuotaSettle, Unsettled};
use crate::body_end::{Reads, WatchedBody};
use crate::usage::{AnswerScan, BodyUsage};

/// Settles each call to the cost its `reqwest::Response`'s body reports, read as the caller
/// reads the body, unchanged: `ClientQuotaLayer::settle_by(BodyUsage::json(["usage",
/// "total_tokens"])?)`. The answer's `Content-Type` picks JSON or an event stream (see
/// [`BodyUsage`]).
///
/// The settle happens when the body ends, fails or is dropped: to the cost read by then, if it
/// went by; else, for an error answer (400 and up) that reports no usage, to zero (the
/// dependency used nothing); else the estimate stands. The response keeps its URL, headers and
/// extensions; only its body is watched on its way.
impl QuotaSettle<reqwest::Response> for BodyUsage {
    const LATER: bool = true;

    fn settled(&self, _: &reqwest::Response) -> Option<u32> {
        None
    }

    fn leave(&self, response: &mut reqwest::Response, unsettled: Unsettled) {
        let watch = SettleFromBody {
            scan: self.scan_answer(response.status(), response.headers()),
            unsettled,
        };
        let placeholder = reqwest::Response::from(http::Response::new(reqwest::Body::from("")));
        let taken = std::mem::replace(response, placeholder);
        let url = taken.url().clone();
        let (mut parts, inner) = http::Response::<reqwest::Body>::from(taken).into_parts();
        // reqwest keeps the URL beside the `http` parts: it goes back in as its builder puts it.
        if let Ok(with_url) = http::Response::builder().url(url).body(()) {
            parts.extensions.extend(with_url.into_parts().0.extensions);
        }
        let body = reqwest::Body::wrap(WatchedBody::new(inner, Some(watch), &parts.headers));
        *response = reqwest::Response::from(http::Response::from_parts(parts, body));
    }
}

/// The settle of one call, waiting for its body: settled when dropped, at the body's end or
/// before.
struct SettleFromBody {
    scan: AnswerScan,
    unsettled: Unsettled,
}

impl Reads for SettleFromBody {
    fn feed(&mut self, bytes: &[u8]) {
        self.scan.feed(bytes);
    }
}

impl Drop for SettleFromBody {
    fn drop(&mut self) {
        if let Some(cost) = self.scan.cost() {
            self.unsettled.settle(cost);
        }
    }
}
