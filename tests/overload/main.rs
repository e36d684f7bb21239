//! Overload protection (feature `adaptive`): the limit under a step in latency, the classes'
//! ceilings under floods, the permit given back once whatever ends a request, the queue, and the
//! shed answers over HTTP, gRPC and a real listener.

#![cfg(feature = "adaptive")]

#[path = "../common/mod.rs"]
mod common;

mod answers;
mod attack;
mod attack_queue;
mod cancellation;
mod classes;
mod example;
mod limit;
mod metrics;
mod queue;
mod support;
