//! `examples/adaptive.rs` runs end to end in a short mode (phases of 400 ms) and ends with a
//! `RESULT` line of measured figures for both algorithms and every phase.

#[allow(dead_code)]
#[path = "../../examples/adaptive.rs"]
mod example;

use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_adaptive_example_runs_and_reports_measured_ratios() {
    let _cores = crate::common::process::BOTH_CORES.lock().await;
    let result = example::compare(Duration::from_millis(400), 3, 7).await;
    assert!(result.starts_with("RESULT aimd:"), "{result}");
    let (aimd, gradient) = result.split_once("; gradient:").expect("both algorithms");
    for part in [aimd, gradient] {
        for phase in ["c1=16", "c2=4", "c3=16"] {
            assert!(part.contains(phase), "{phase} missing in {part}");
        }
        // Ratios are figures, not placeholders: each parses as a positive number.
        for ratio in part.split_whitespace().filter_map(|w| w.split_once('=')) {
            if let Some(x) = ratio.1.strip_suffix('x') {
                let value: f64 = x.parse().expect("a number");
                assert!(value > 0.0 && value.is_finite(), "{part}");
            }
        }
        assert!(part.contains("within_2x_after_drop="), "{part}");
    }
}
