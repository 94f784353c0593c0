//! The backend suite on the process executor over TCP (each rank a "process" with its
//! own job and connections, as under `coconet-launch`; here threads of one test process
//! on loopback), bitwise against the reference interpreter.

#[path = "support/examples.rs"]
mod examples;
use examples::*;

#[macro_use]
#[path = "support/backend_suite.rs"]
mod backend_suite;

#[path = "support/loopback.rs"]
mod loopback;

backend_suite!(loopback::Loopback::default(), [1, 2, 3, 4]);
