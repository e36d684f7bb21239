//! Classes under floods: with the limit fixed, tasks of every class racing find exactly the
//! ceilings, and a shed request never reaches the service.

use std::sync::atomic::Ordering;

use tower::ServiceExt;
use tower_bulwark::overload::Priority;

use crate::support::{answer_to, fixed, gated, request};

const CLASSES: [Priority; 3] = [Priority::Critical, Priority::Default, Priority::Sheddable];

/// Floods a protection of limit 10 (`Critical` borrowing up to `borrowing` times it) with
/// `per_class` racing requests of each class; returns how many of each class reached the
/// service, once every request was admitted or shed.
async fn flood(guarantees: &[(Priority, f64)], borrowing: f64, per_class: usize) -> [usize; 3] {
    let mut builder = fixed(10).critical_borrowing(borrowing).unwrap();
    for &(class, share) in guarantees {
        builder = builder.guarantee(class, share).unwrap();
    }
    let overload = builder.build();
    let (service, gated, mut entered) = gated(&overload);
    let (shed_tx, mut shed_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for i in 0..per_class * 3 {
        let (service, shed_tx) = (service.clone(), shed_tx.clone());
        let class = CLASSES[i % 3];
        tasks.push(tokio::spawn(async move {
            let response = service.oneshot(request(class)).await.unwrap();
            if response.status() == 503 {
                shed_tx.send(class).unwrap();
            }
            axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .unwrap();
        }));
    }
    let (mut reached, mut shed) = ([0; 3], 0);
    while reached.iter().sum::<usize>() + shed < per_class * 3 {
        tokio::select! {
            Some(class) = entered.recv() => reached[index(class)] += 1,
            Some(_) = shed_rx.recv() => shed += 1,
        }
    }
    assert_eq!(overload.in_flight(), reached.iter().sum::<usize>());
    assert_eq!(
        gated.reached.load(Ordering::SeqCst),
        reached.iter().sum::<usize>(),
        "a shed request reached the service"
    );
    gated.gate.add_permits(per_class * 3);
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(overload.in_flight(), 0);
    reached
}

fn index(class: Priority) -> usize {
    CLASSES.iter().position(|&c| c == class).unwrap()
}

/// Twenty floods of a limit of 10 that keeps 0.2 for `Critical`, which may borrow up to
/// `borrowing` times the limit: the lower classes never take more than 8, `Critical` gets at
/// least `critical_at_least`, and together they fill the ceiling, `ceiling`, exactly.
async fn critical_guarantee_holds(borrowing: f64, critical_at_least: usize, ceiling: usize) {
    for _ in 0..20 {
        let [critical, default, sheddable] =
            flood(&[(Priority::Critical, 0.2)], borrowing, 40).await;
        assert!(default + sheddable <= 8, "{default} + {sheddable}");
        assert!(critical >= critical_at_least, "critical got {critical}");
        assert_eq!(critical + default + sheddable, ceiling);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lower_classes_never_take_the_critical_guarantee() {
    critical_guarantee_holds(1.0, 2, 10).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn critical_borrows_up_to_its_factor_of_the_limit_and_no_lower_class_does() {
    critical_guarantee_holds(2.5, 17, 25).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_class_finds_its_own_ceiling() {
    let guarantees = [(Priority::Critical, 0.2), (Priority::Default, 0.3)];
    for _ in 0..20 {
        let [critical, default, sheddable] = flood(&guarantees, 1.0, 40).await;
        assert!(sheddable <= 5, "sheddable got {sheddable}");
        assert!(default + sheddable <= 8, "{default} + {sheddable}");
        assert_eq!(critical + default + sheddable, 10);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_guarantees_every_class_shares_the_limit() {
    let guarantees = [(Priority::Critical, 0.0), (Priority::Default, 0.0)];
    let reached = flood(&guarantees, 1.0, 40).await;
    assert_eq!(reached.iter().sum::<usize>(), 10);
}

#[tokio::test]
async fn a_critical_request_is_admitted_while_lower_ones_are_shed() {
    let overload = fixed(10)
        .guarantee(Priority::Critical, 0.2)
        .unwrap()
        .build();
    let (service, gated, _entered) = gated(&overload);
    let mut held = Vec::new();
    for _ in 0..8 {
        let call = service.clone().oneshot(request(Priority::Sheddable));
        held.push(tokio::spawn(call));
    }
    while gated.reached.load(Ordering::SeqCst) < 8 {
        tokio::task::yield_now().await;
    }
    let shed = answer_to(&service, Priority::Default).await;
    assert_eq!(shed.status(), 503);
    assert_eq!(overload.ceiling(Priority::Critical), 10);
    assert_eq!(overload.ceiling(Priority::Default), 8);
    let critical = tokio::spawn(service.clone().oneshot(request(Priority::Critical)));
    while gated.reached.load(Ordering::SeqCst) < 9 {
        tokio::task::yield_now().await;
    }
    gated.gate.add_permits(9);
    assert_eq!(critical.await.unwrap().unwrap().status(), 200);
    for call in held {
        drop(call.await.unwrap().unwrap());
    }
    assert_eq!(overload.in_flight(), 0);
}
