//! What the coconet package's integration tests share, compiled once for all of them:
//! the backend suite ([`backend_suite!`], instantiated by each backend's test file on the
//! example programs) and [`loopback`], a multi-process job in one test process.

mod backend_suite;
pub mod loopback;

/// The example programs, as the backend suite names them.
#[doc(hidden)]
pub use coconet_example_programs as __programs;
