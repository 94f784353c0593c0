//! # coconet-plan: plans and the backend contract
//!
//! A [`Schedule`](coconet_core::Schedule) is lowered to a per-rank [`Plan`] (steps and
//! buffers), which a [`Backend`] executes. This crate is the floor every backend stands
//! on: the plan (the only thing a backend reads), the [`Backend`] and [`JobData`] traits,
//! the errors of planning and running, and the host memory and arithmetic that more than
//! one backend computes with. The backends themselves are crates above it (`coconet-cpu`,
//! `coconet-cuda`); `coconet-runtime` gathers them under one facade.

pub mod backend;
pub mod plan;

mod error;

// Shared by the backend crates above; not a stable API.
#[doc(hidden)]
pub mod agreement;
#[doc(hidden)]
pub mod host;

pub use backend::{Backend, JobData};
pub use error::{RuntimeError, panic_message};
pub use plan::{Plan, PlanStep, Storage};
