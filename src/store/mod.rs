//! Where an in-memory limiter's state lives: one state per key in a sharded, bounded table
//! ([`memory`]). The Redis limiter (feature `redis`) keeps the same state in Redis: see
//! [`crate::redis`].

pub(crate) mod memory;
