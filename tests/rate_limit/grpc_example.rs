//! `examples/grpc.rs` over a real listener: the tonic client behind `Pushback` sends its 20 calls
//! and none goes out while a refusal's delay it has read is still running.

#[path = "../../examples/grpc.rs"]
#[allow(dead_code)]
pub(crate) mod grpc;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grpc_examples_client_sends_no_call_early() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(grpc::serve(listener));
    let outcome = grpc::run_client(addr).await.unwrap();
    assert_eq!(outcome.early_calls, 0, "{outcome:?}");
    assert_eq!(
        outcome.ok + outcome.refused,
        20,
        "every call answered: {outcome:?}"
    );
    assert!(
        outcome.ok >= 10,
        "the pushback paced the calls: {outcome:?}"
    );
}
