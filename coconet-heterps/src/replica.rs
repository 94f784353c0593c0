//! One replica's share of a pipelined step, whatever carries the activations and
//! gradients between stages: channels between threads ([`CtrPipeline`](super::CtrPipeline))
//! or TCP connections between processes ([`CtrStageProcess`](super::CtrStageProcess)).
//!
//! The schedule is GPipe's fill-drain: the forwards of the replica's micro-batches in
//! order (each activation sent on as it is made), then their backwards in reverse order
//! (each input gradient sent back). Micro-batch m's gradients are weighted by its share
//! of the global batch, so the replica's sum is its part of one worker's gradient on the
//! whole batch.

use super::HeterpsError;
use crate::data::EmbeddingTable;
use crate::train::{CtrDnn, StageInput, TrainError};
use candle_core::Tensor;
use candle_core::backprop::GradStore;
use std::borrow::Cow;
use std::time::Instant;

/// Why a replica did not finish its part of a step.
pub(super) enum ReplicaEnd {
    /// Its own failure: the error that counts.
    Failed(HeterpsError),
    /// A neighbour stopped before sending what it waited for (a consequence of the
    /// neighbour's own failure, which is the one reported).
    NeighbourStopped(String),
}

impl From<HeterpsError> for ReplicaEnd {
    fn from(e: HeterpsError) -> Self {
        ReplicaEnd::Failed(e)
    }
}

impl From<TrainError> for ReplicaEnd {
    fn from(e: TrainError) -> Self {
        ReplicaEnd::Failed(e.into())
    }
}

/// What a stage knows of a micro-batch besides its input.
pub(super) struct Micro<'b> {
    /// The records' labels (the last stage's loss needs them).
    pub labels: Cow<'b, [f32]>,
    /// Its records' share of the global batch.
    pub weight: f64,
}

/// How a replica reaches its neighbours, for its `j`-th micro-batch of the step.
pub(super) trait Links<'b> {
    /// The micro-batch's input (its records, or the previous stage's activation) and
    /// what goes with it.
    fn input(&mut self, j: usize) -> Result<(StageInput<'b>, Micro<'b>), ReplicaEnd>;
    /// Sends the stage's output on (nothing on the last stage).
    fn send_activation(
        &mut self,
        j: usize,
        output: &Tensor,
        micro: &Micro<'b>,
    ) -> Result<(), ReplicaEnd>;
    /// The gradient of the stage's output, from the next stage (`None` on the last).
    fn gradient(&mut self, j: usize) -> Result<Option<Tensor>, ReplicaEnd>;
    /// Sends the gradient of the stage's input back (nothing on the first stage).
    fn send_gradient(&mut self, j: usize, grad: Tensor) -> Result<(), ReplicaEnd>;
}

/// What one replica's share of a step produced.
pub(super) struct ReplicaOutcome {
    /// Its weighted dense gradients, summed over its micro-batches and multiplied by
    /// the stage's replica count (the data-parallel step averages over replicas).
    pub dense: Option<GradStore>,
    /// `(micro-batch, keys, weighted row gradients)` of the first stage.
    pub rows: Vec<(usize, Vec<u64>, Vec<f32>)>,
    /// `(micro-batch, weighted loss)` of the last stage.
    pub losses: Vec<(usize, f32)>,
    /// Seconds spent in forwards and backwards (not waiting).
    pub busy: f64,
}

/// Runs a replica of the stage of layers `first..=last` (of `replicas` replicas) over
/// its micro-batches `micro` (global indices, ascending), fill-drain.
pub(super) fn replica_pass<'b>(
    model: &CtrDnn,
    table: &dyn EmbeddingTable,
    (first, last, replicas): (usize, usize, usize),
    micro: &[usize],
    links: &mut dyn Links<'b>,
) -> Result<ReplicaOutcome, ReplicaEnd> {
    let mut busy = 0.0;
    let mut kept = Vec::with_capacity(micro.len());
    for j in 0..micro.len() {
        let (input, m) = links.input(j)?;
        let t = Instant::now();
        let f = model.stage_forward(table, first, last, input, &m.labels)?;
        busy += t.elapsed().as_secs_f64();
        links.send_activation(j, &f.output, &m)?;
        kept.push((f, m.weight));
    }
    let mut out = ReplicaOutcome {
        dense: None,
        rows: Vec::new(),
        losses: Vec::new(),
        busy: 0.0,
    };
    let vars = model.stage_vars(first, last);
    let mut sums: Vec<Option<Tensor>> = vec![None; vars.len()];
    for (j, (f, weight)) in kept.into_iter().enumerate().rev() {
        let mb = micro[j];
        let grad = links.gradient(j)?;
        if let Some(loss) = f.loss {
            out.losses.push((mb, loss * weight as f32));
        }
        let t = Instant::now();
        let b = model.stage_backward(f, grad.as_ref())?;
        busy += t.elapsed().as_secs_f64();
        if let Some(g) = b.input_grad {
            links.send_gradient(j, g)?;
        }
        if let Some((keys, mut g)) = b.rows {
            g.iter_mut().for_each(|g| *g *= weight as f32);
            out.rows.push((mb, keys, g));
        }
        for (sum, var) in sums.iter_mut().zip(&vars) {
            let g = b.dense.get(var.as_tensor()).ok_or_else(|| {
                HeterpsError::Mismatch("a layer of the stage got no gradient".into())
            })?;
            let g = (g * weight).map_err(TrainError::from)?;
            *sum = Some(match sum.take() {
                Some(s) => (s + g).map_err(TrainError::from)?,
                None => g,
            });
        }
    }
    if !vars.is_empty() {
        let mut store = GradStore::default();
        for (var, sum) in vars.iter().zip(sums) {
            let sum = sum.ok_or_else(|| HeterpsError::Mismatch("no micro-batch".into()))?;
            store.insert(
                var.as_tensor(),
                (sum * replicas as f64).map_err(TrainError::from)?,
            );
        }
        out.dense = Some(store);
    }
    out.busy = busy;
    Ok(out)
}
