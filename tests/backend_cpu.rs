//! The backend suite on the CPU backend (rank threads in this process).

#[path = "support/examples.rs"]
mod examples;
use examples::*;

#[macro_use]
#[path = "support/backend_suite.rs"]
mod backend_suite;

backend_suite!(coconet::runtime::cpu::Cpu::default());
