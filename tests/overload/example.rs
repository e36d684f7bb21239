//! `examples/overload.rs` over a real listener, read by reqwest: a burst of each class in turn
//! into the example's handler and protection, with work long enough that nothing ends during the
//! burst, so that what is admitted and what is shed depends on the ceilings alone.

#[path = "../../examples/overload.rs"]
#[allow(dead_code)]
mod overload_example;

use std::time::Duration;

use overload_example::{app, protection, Processor};
use tokio::sync::mpsc;
use tower_bulwark::overload::Priority;

/// An answer: status, `Retry-After`, body.
type Answer = (u16, Option<String>, String);

/// Sends `count` requests of `class` at once; each answer comes on the receiver.
fn burst(client: &reqwest::Client, url: &str, class: &str, count: usize) -> mpsc::Receiver<Answer> {
    let (sender, answers) = mpsc::channel(count);
    for _ in 0..count {
        let request = client.get(url).header("x-priority", class);
        let sender = sender.clone();
        tokio::spawn(async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            let retry_after =
                (response.headers().get("retry-after")).map(|v| v.to_str().unwrap().to_owned());
            let _ = sender
                .send((status, retry_after, response.text().await.unwrap()))
                .await;
        });
    }
    answers
}

/// A shed answer: `503` with a whole number of seconds of at least 1 in `Retry-After`, and a
/// problem body.
fn assert_shed((status, retry_after, body): &Answer, class: &str) {
    assert_eq!(*status, 503, "{class}: {body}");
    let seconds: u64 = retry_after
        .as_deref()
        .expect("a Retry-After")
        .parse()
        .unwrap();
    assert!(seconds >= 1, "{class}: Retry-After {seconds}");
    assert!(body.contains("\"status\":503"), "{class}: {body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_sheds_sheddable_first_and_admits_every_critical_request() {
    let overload = protection();
    let classes = [Priority::Sheddable, Priority::Default, Priority::Critical];
    let ceilings = classes.map(|class| overload.ceiling(class));
    assert!(
        ceilings[0] < ceilings[1] && ceilings[1] + 8 <= ceilings[2],
        "{ceilings:?}"
    );
    // Sheddable and default each send 4 more than their ceilings leave them, critical 8.
    let counts = [ceilings[0] + 4, ceilings[1] - ceilings[0] + 4, 8];

    // Work of 1 s at a capacity of 8: the first request ends a second after the burst began.
    let processor = Processor::start(8, Duration::from_secs(1));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/work", listener.local_addr().unwrap());
    let service = app(processor, Some(&overload));
    tokio::spawn(async move { axum::serve(listener, service).await });
    let client = reqwest::Client::new();

    let mut in_flight = 0;
    let mut admitted = Vec::new();
    for ((name, count), ceiling) in ["sheddable", "default", "critical"]
        .into_iter()
        .zip(counts)
        .zip(ceilings)
    {
        let mut answers = burst(&client, &url, name, count);
        // Up to the class's ceiling, all classes together, is admitted; the rest is shed at once.
        let admits = count.min(ceiling - in_flight);
        for _ in admits..count {
            let answer = tokio::time::timeout(Duration::from_secs(5), answers.recv()).await;
            assert_shed(&answer.unwrap().unwrap(), name);
        }
        in_flight += admits;
        // The admitted requests reach the service in their own time (all of them, when none is
        // shed).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while overload.in_flight() < in_flight && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(overload.in_flight(), in_flight, "{name}");
        admitted.push((name, admits, answers));
    }
    assert_eq!(admitted[2].1, 8, "every critical request is admitted");
    for (name, admits, mut answers) in admitted {
        for _ in 0..admits {
            let answer = tokio::time::timeout(Duration::from_secs(20), answers.recv()).await;
            let (status, _, body) = answer.unwrap().unwrap();
            assert_eq!((status, body.as_str()), (200, "done"), "{name}");
        }
    }
    assert_eq!(overload.in_flight(), 0);
}
