//! A run's launches replayed as one graph (a CUDA graph on a GPU), to take the
//! per-launch cost of the driver out of every step.
//!
//! Each run still resolves its launches on the host exactly as a run without a graph
//! does — the same pointers, tables and scalars — so a replay can never run another
//! step than a plain run would. What changes is how they reach the device: the first
//! run builds a graph of them; later runs compare each launch with the one the graph
//! holds and update only those that differ (a new step's bias corrections, a new
//! learning rate, memory lent at another address), then queue the graph with one call.
//! A run whose launches differ in number or kernels (pieces lent in another shape)
//! builds a new graph.
//!
//! Launches between other work — a matmul on cuBLAS's stream, an exchange between ranks,
//! a barrier — are cut into segments, a graph each ([`LaunchGraphs`]), queued where the
//! launches would have been: the other work stays where it was, in order.

use crate::devices::{Device, KernelCall};
use coconet_plan::RuntimeError;

/// What a job's graphs have cost so far, over every segment of its runs (a run of
/// launches between other work is one graph): graphs built, launches updated in place,
/// and replays (one per segment and run). A training loop whose shapes stay the same
/// builds each segment's graph once and updates only the launches whose scalars or
/// addresses changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GraphStats {
    /// Graphs built (each segment's at the first run, and again where its launches
    /// changed kernels).
    pub builds: usize,
    /// Launches updated in an existing graph.
    pub updates: usize,
    /// Segments queued as a graph.
    pub replays: usize,
}

/// The graph of a job's runs and the launches it holds.
pub(crate) struct LaunchGraph<G> {
    held: Option<(G, Vec<KernelCall>)>,
    stats: GraphStats,
}

impl<G> Default for LaunchGraph<G> {
    fn default() -> Self {
        LaunchGraph {
            held: None,
            stats: GraphStats::default(),
        }
    }
}

impl<G> LaunchGraph<G> {
    /// What the graph has cost so far.
    pub(crate) fn stats(&self) -> GraphStats {
        self.stats
    }

    /// Queues `calls` on `device` as the graph: built when the held one launches other
    /// kernels, else updated where a launch differs.
    pub(crate) fn replay<D: Device<Graph = G>>(
        &mut self,
        device: &D,
        calls: Vec<KernelCall>,
    ) -> Result<(), RuntimeError> {
        if calls.is_empty() {
            return Ok(());
        }
        let graph = match &mut self.held {
            Some((graph, held)) if same_kernels(held, &calls) => {
                for (i, (held, call)) in held.iter_mut().zip(calls).enumerate() {
                    if *held != call {
                        device.update_graph(graph, i, &call)?;
                        *held = call;
                        self.stats.updates += 1;
                    }
                }
                graph
            }
            _ => {
                // The old graph goes first: replays of it already queued keep running.
                self.held = None;
                let graph = device.graph(&calls)?;
                self.stats.builds += 1;
                &mut self.held.insert((graph, calls)).0
            }
        };
        device.replay(graph)?;
        self.stats.replays += 1;
        Ok(())
    }
}

/// Whether `a` and `b` launch the same kernels in the same order (so `b` can update
/// `a`'s graph in place).
fn same_kernels(a: &[KernelCall], b: &[KernelCall]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.kernel == y.kernel)
}

/// A run's launches cut at the work between them: one [`LaunchGraph`] per segment, in
/// the order of the run.
pub(crate) struct LaunchGraphs<G> {
    segments: Vec<LaunchGraph<G>>,
    /// The current segment's launches, not yet queued.
    pending: Vec<KernelCall>,
    /// The current segment's index in this run.
    next: usize,
}

impl<G> Default for LaunchGraphs<G> {
    fn default() -> Self {
        LaunchGraphs {
            segments: Vec::new(),
            pending: Vec::new(),
            next: 0,
        }
    }
}

impl<G> LaunchGraphs<G> {
    /// Turns a job's graphs on (kept if they are) or off.
    pub(crate) fn switch(graphs: &mut Option<LaunchGraphs<G>>, on: bool) {
        match on {
            true => {
                graphs.get_or_insert_with(LaunchGraphs::default);
            }
            false => *graphs = None,
        }
    }

    /// What the graphs have cost so far, all segments together.
    pub(crate) fn stats(&self) -> GraphStats {
        let mut total = GraphStats::default();
        for s in &self.segments {
            let t = s.stats();
            total.builds += t.builds;
            total.updates += t.updates;
            total.replays += t.replays;
        }
        total
    }

    /// Starts a run at its first segment.
    pub(crate) fn begin(&mut self) {
        self.pending.clear();
        self.next = 0;
    }

    /// Adds `call` to the current segment.
    pub(crate) fn push(&mut self, call: KernelCall) {
        self.pending.push(call);
    }

    /// Queues the current segment (before the work that ends it) and starts the next.
    pub(crate) fn cut<D: Device<Graph = G>>(&mut self, device: &D) -> Result<(), RuntimeError> {
        if self.segments.len() <= self.next {
            self.segments
                .resize_with(self.next + 1, LaunchGraph::default);
        }
        let calls = std::mem::take(&mut self.pending);
        let queued = self.segments[self.next].replay(device, calls);
        self.next += 1;
        queued
    }
}
