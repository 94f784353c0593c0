//! What the coconet package's integration tests share, compiled once for all of them:
//! [`loopback`], a multi-process job in one test process (the backend suite they
//! instantiate is the published `coconet-backend-suite`).

pub mod loopback;
