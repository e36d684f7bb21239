//! Where limiter state lives.
//!
//! The in-memory store ([`memory`]) keeps one state per key in a sharded, bounded table. The Redis
//! store (feature `redis`) keeps the same state in Redis and runs each algorithm as a Lua script,
//! so that the read-modify-write is atomic on the server.

pub mod memory;
#[cfg(feature = "redis")]
pub mod redis;

pub use memory::Overflow;
