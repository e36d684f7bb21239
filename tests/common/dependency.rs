//! A dependency on 127.0.0.1 that answers as the test scripts it (a wiremock server).

use wiremock::matchers::path;
use wiremock::{Match, Mock, MockServer, ResponseTemplate};

/// A mock server answering each path of `routes` with its answer.
pub async fn answering(routes: impl IntoIterator<Item = (&str, ResponseTemplate)>) -> MockServer {
    let server = MockServer::start().await;
    for (at, answer) in routes {
        mount(&server, path(at), answer).await;
    }
    server
}

/// Has `server` answer every request `matcher` matches with `answer`.
pub async fn mount(server: &MockServer, matcher: impl Match + 'static, answer: ResponseTemplate) {
    Mock::given(matcher)
        .respond_with(answer)
        .mount(server)
        .await;
}

/// Has `server` answer the first request `matcher` matches with `answer`, before any other
/// answer mounted for it; later ones go to those.
pub async fn mount_once(
    server: &MockServer,
    matcher: impl Match + 'static,
    answer: ResponseTemplate,
) {
    let mock = Mock::given(matcher).respond_with(answer);
    mock.up_to_n_times(1).with_priority(1).mount(server).await;
}

/// Has `server` answer with `answer` every request `matcher` matches that no other answer
/// mounted on it matches.
pub async fn mount_fallback(
    server: &MockServer,
    matcher: impl Match + 'static,
    answer: ResponseTemplate,
) {
    let mock = Mock::given(matcher).respond_with(answer);
    mock.with_priority(10).mount(server).await;
}

/// How many requests for `route` `server` has received.
pub async fn received(server: &MockServer, route: &str) -> usize {
    let requests = server.received_requests().await.unwrap();
    requests.iter().filter(|r| r.url.path() == route).count()
}

/// The pushback and the client quota named `name` in `registry`, in that order around a
/// `reqwest::Client`.
#[cfg(all(feature = "config", feature = "reqwest"))]
pub fn configured_client(
    registry: &tower_bulwark::config::Registry,
    name: &str,
) -> tower::util::BoxCloneService<reqwest::Request, reqwest::Response, tower_bulwark::BoxError> {
    let client = tower::ServiceBuilder::new()
        .layer(registry.pushback(name).unwrap().layer())
        .layer(registry.client_quota_layer(name).unwrap())
        .service(reqwest::Client::new());
    tower::util::BoxCloneService::new(client)
}
