// A client whose answers the pushback cannot read (here a type of the user's; in the wild, a
// `Response` of a reqwest major that the `reqwest` feature does not speak): the error names
// `ResponseHead` and says what to check.
use tower::{service_fn, Layer, Service};
use tower_bulwark::outbound::Pushback;
use tower_bulwark::BoxError;

struct OtherResponse;

fn send<S: Service<()>>(_: S) {}

fn main() {
    let client = Pushback::new("partner")
        .layer()
        .layer(service_fn(|_: ()| async { Ok::<_, BoxError>(OtherResponse) }));
    send(client);
}
