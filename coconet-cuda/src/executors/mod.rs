//! What runs a plan's action lists: one device with all ranks virtual ([`device_job`]),
//! one rank among many with its own device ([`rank_job`]), and rank jobs as the
//! threads of one process ([`rank_threads`]); both executors take memory lent to a run
//! the same way ([`lending`]), read values the same way ([`reads`]) and may replay
//! their launches as graphs ([`launch_graph`]).

pub(crate) mod device_job;
pub(crate) mod launch_graph;
pub(crate) mod lending;
pub(crate) mod rank_job;
pub(crate) mod rank_threads;
pub(crate) mod reads;
