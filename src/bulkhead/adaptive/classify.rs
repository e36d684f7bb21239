//! Classifiers: which answers of the dependency say that it is overloaded.

use std::error::Error;
use std::fmt;
use std::io;

use http::StatusCode;
use tower_http::classify::{ClassifiedResponse, ClassifyResponse, NeverClassifyEos};

use crate::head::ResponseHead;
use crate::BoxError;

/// The kinds of `io::Error` that say the dependency timed out or its connection failed.
const CUT: [io::ErrorKind; 6] = {
    use io::ErrorKind::*;
    [
        TimedOut,
        ConnectionRefused,
        ConnectionReset,
        ConnectionAborted,
        NotConnected,
        BrokenPipe,
    ]
};

/// What one finished call says about the dependency.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// The dependency answered in its own time: a latency sample.
    Healthy,
    /// The dependency is overloaded (429, 503, 504, a timeout, a refused or reset connection):
    /// the limit comes down.
    Overloaded,
    /// Not a sample: the call says nothing about the dependency's load (a malformed request, a
    /// refusal by another bulkhead below this one).
    Ignored,
}

/// Decides what a response, or an error of the inner service, says about the dependency.
///
/// Implemented by [`HttpOverload`] (the default), by [`FromTowerHttp`] for any tower-http 0.7
/// classifier, and by every closure `Fn(Result<&Res, &BoxError>) -> Verdict`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot judge the inner service's answers of type `{Res}`",
    label = "this classifier does not implement `Classify<{Res}>`",
    note = "`HttpOverload` judges any `ResponseHead` (`http::Response<B>`, and reqwest 0.13's `Response` with the `reqwest` feature); `FromTowerHttp` wraps tower-http 0.7's classifiers and judges `http::Response<B>`",
    note = "with another major of reqwest or tower-http (check `cargo tree -d`), convert the answers with `.map_response(http::Response::from)` below the bulkhead, or pass a closure `|result: Result<&{Res}, &BoxError>| -> Verdict`"
)]
pub trait Classify<Res>: Send + Sync + 'static {
    /// The verdict on one call's result; the error is the inner service's, boxed.
    fn classify(&self, result: Result<&Res, &BoxError>) -> Verdict;
}

impl<F, Res> Classify<Res> for F
where
    F: Fn(Result<&Res, &BoxError>) -> Verdict + Send + Sync + 'static,
{
    fn classify(&self, result: Result<&Res, &BoxError>) -> Verdict {
        self(result)
    }
}

/// The default classifier for HTTP dependencies.
///
/// * Responses: `429 Too Many Requests`, `503 Service Unavailable` and `504 Gateway Timeout` are
///   overload; every other status is a healthy latency sample (a `500` is the dependency's own
///   failure, answered in its own time). With the `grpc` feature, a trailers-only gRPC answer
///   (an HTTP 200 with `grpc-status` in its headers) is judged by that status instead:
///   `RESOURCE_EXHAUSTED`, `UNAVAILABLE` and `DEADLINE_EXCEEDED` are overload (a status on
///   lines that differ names none, as the [pushback](crate::outbound::pushback) reads it). (A
///   status in the trailers of a streamed answer comes after the verdict.)
/// * Errors: a timeout or a connection that could not be made or was cut — found anywhere in the
///   error's chain of sources as an `std::io::Error` of kind `TimedOut`, `ConnectionRefused`,
///   `ConnectionReset`, `ConnectionAborted`, `NotConnected` or `BrokenPipe`, as tokio's or
///   tower's `Elapsed` (a `TimeoutLayer` below the bulkhead), or (feature `reqwest`) as a
///   `reqwest::Error` that is a timeout or a connect error or as hyper's "connection closed
///   before message completed" (the dependency closed the connection without a whole answer)
///   — is overload. A refusal by one of the crate's layers further in (a [`BulkheadFull`](crate::BulkheadFull), a
///   `PushedBack`, a `QuotaExhausted`, a `BreakerOpen`), and every other error, is ignored: it
///   says nothing about the dependency's latency.
///
/// It judges any [`ResponseHead`]: `http::Response<B>`, `http::response::Parts` and, with the
/// `reqwest` feature, `reqwest::Response`, so it works for `reqwest::Client` as it is. It is
/// also a tower-http [`ClassifyResponse`], whose failures are the overload answers, so the same
/// rule can drive tower-http's `TraceLayer`.
#[derive(Clone, Copy, Debug, Default)]
pub struct HttpOverload {
    _private: (),
}

impl HttpOverload {
    /// The verdict on a status code: overload for 429, 503 and 504.
    pub fn classify_status(status: StatusCode) -> Verdict {
        match status {
            StatusCode::TOO_MANY_REQUESTS
            | StatusCode::SERVICE_UNAVAILABLE
            | StatusCode::GATEWAY_TIMEOUT => Verdict::Overloaded,
            _ => Verdict::Healthy,
        }
    }

    /// The verdict on an error of the inner service (see the type's docs for the rule).
    pub fn classify_error(error: &(dyn Error + 'static)) -> Verdict {
        // A refusal by the crate's own layers below reached nothing: whatever else its chain
        // holds (a gRPC status, say), it says nothing of the dependency.
        if crate::outbound::never_sent(error) {
            return Verdict::Ignored;
        }
        for error in crate::outbound::chain(error) {
            if error.is::<tokio::time::error::Elapsed>()
                || error.is::<tower::timeout::error::Elapsed>()
            {
                return Verdict::Overloaded;
            }
            if let Some(error) = error.downcast_ref::<io::Error>() {
                if CUT.contains(&error.kind()) {
                    return Verdict::Overloaded;
                }
            }
            #[cfg(feature = "reqwest")]
            if let Some(error) = error.downcast_ref::<reqwest::Error>() {
                if error.is_timeout() || error.is_connect() {
                    return Verdict::Overloaded;
                }
            }
            // A connection the dependency closed before its answer was complete: cut, though
            // no `io::Error` says so.
            #[cfg(feature = "reqwest")]
            if let Some(error) = error.downcast_ref::<hyper::Error>() {
                if error.is_incomplete_message() {
                    return Verdict::Overloaded;
                }
            }
        }
        Verdict::Ignored
    }
}

impl<R: ResponseHead> Classify<R> for HttpOverload {
    fn classify(&self, result: Result<&R, &BoxError>) -> Verdict {
        match result {
            // A proxy's 429, 503 or 504 is overload whatever gRPC status it carries.
            #[cfg(feature = "grpc")]
            Ok(response)
                if response.status() == http::StatusCode::OK
                    && grpc_overloaded(response.headers()) =>
            {
                Verdict::Overloaded
            }
            Ok(response) => Self::classify_status(response.status()),
            Err(error) => Self::classify_error(&**error),
        }
    }
}

/// Whether a trailers-only gRPC answer (feature `grpc`) is overload by its `grpc-status`:
/// `RESOURCE_EXHAUSTED`, `UNAVAILABLE` and `DEADLINE_EXCEEDED` are; any other status is a
/// healthy sample (the dependency answered in its own time), as a 200 is.
#[cfg(feature = "grpc")]
fn grpc_overloaded(headers: &http::HeaderMap) -> bool {
    let code = crate::head::one_value(headers, &crate::head::GRPC_STATUS);
    matches!(code, Ok(Some(b"4" | b"8" | b"14")))
}

/// The tower-http failure class of [`HttpOverload`]: why an answer counts as overload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OverloadClass {
    /// An overload status (429, 503 or 504).
    Status(StatusCode),
    /// An error; tower-http's `classify_error` treats every error as a failure, so this is any
    /// error, with its message.
    Error(String),
}

impl fmt::Display for OverloadClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Status(status) => write!(f, "overload status {status}"),
            Self::Error(message) => write!(f, "error: {message}"),
        }
    }
}

impl ClassifyResponse for HttpOverload {
    type FailureClass = OverloadClass;
    type ClassifyEos = NeverClassifyEos<OverloadClass>;

    fn classify_response<B>(
        self,
        response: &http::Response<B>,
    ) -> ClassifiedResponse<Self::FailureClass, Self::ClassifyEos> {
        let status = response.status();
        ClassifiedResponse::Ready(match Self::classify_status(status) {
            Verdict::Overloaded => Err(OverloadClass::Status(status)),
            _ => Ok(()),
        })
    }

    fn classify_error<E>(self, error: &E) -> Self::FailureClass
    where
        E: fmt::Display + 'static,
    {
        OverloadClass::Error(error.to_string())
    }
}

/// Lets any tower-http [`ClassifyResponse`] (such as `ServerErrorsAsFailures` or
/// `StatusInRangeAsFailures`) decide for an adaptive bulkhead: a response it classifies as a
/// failure is overload, any other response is healthy.
///
/// A response whose verdict would come at the end of its stream (gRPC's trailers) is healthy:
/// the adaptive bulkhead decides when the response head arrives. Errors are judged by
/// [`HttpOverload`]'s rule, since tower-http's classifiers take every error for a failure.
///
/// It judges `http::Response<B>` and, with the `reqwest` feature, reqwest's `Response`, whose
/// status, version and headers it copies into an `http::Response<()>` for the classifier (one
/// copy of the header map per call: tower-http's classifiers read only `http` types).
#[derive(Clone, Copy, Debug, Default)]
pub struct FromTowerHttp<C>(pub C);

#[cfg(feature = "reqwest")]
impl<C> Classify<reqwest::Response> for FromTowerHttp<C>
where
    C: ClassifyResponse + Clone + Send + Sync + 'static,
{
    fn classify(&self, result: Result<&reqwest::Response, &BoxError>) -> Verdict {
        let head = result.map(|response| {
            let mut head = http::Response::new(());
            *head.status_mut() = response.status();
            *head.version_mut() = response.version();
            *head.headers_mut() = response.headers().clone();
            head
        });
        self.classify(head.as_ref().map_err(|error| *error))
    }
}

impl<C, B> Classify<http::Response<B>> for FromTowerHttp<C>
where
    C: ClassifyResponse + Clone + Send + Sync + 'static,
{
    fn classify(&self, result: Result<&http::Response<B>, &BoxError>) -> Verdict {
        match result.map(|response| self.0.clone().classify_response(response)) {
            Ok(ClassifiedResponse::Ready(Err(_))) => Verdict::Overloaded,
            Ok(ClassifiedResponse::Ready(Ok(())) | ClassifiedResponse::RequiresEos(_)) => {
                Verdict::Healthy
            }
            Err(error) => HttpOverload::classify_error(&**error),
        }
    }
}
