//! The answer to a shed request: `503` with `Retry-After` and a problem+json body, or for a gRPC
//! call (feature `grpc`) `UNAVAILABLE` with the delay as the crate's other gRPC answers give it.

use http::header::{HeaderValue, RETRY_AFTER};
use http::{Response, StatusCode};

use super::service::OverloadBody;
use super::state::Shared;

/// The answer to a request `shared` sheds, as a gRPC call's when `grpc`.
pub(super) fn shed<B>(shared: &Shared, grpc: bool) -> Response<OverloadBody<B>> {
    let retry_after = shared.retry_after();
    let secs = retry_after.as_secs();
    let unit = if secs == 1 { "second" } else { "seconds" };
    let detail = format!(
        "'{}' is overloaded and shed the request; retry in {secs} {unit}.",
        shared.name
    );
    #[cfg(feature = "grpc")]
    if grpc {
        let code = tonic::Code::Unavailable;
        return crate::rate_limit::grpc::status_response(code, detail, Some(retry_after))
            .map(OverloadBody::from);
    }
    let _ = grpc;
    let mut response =
        crate::rate_limit::problem_response(StatusCode::SERVICE_UNAVAILABLE, &detail);
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(secs));
    response.map(OverloadBody::from)
}
