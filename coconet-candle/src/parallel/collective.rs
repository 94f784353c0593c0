//! The collectives of the tensor-parallel layers — what each computes, the coconet
//! program that computes it, its inputs and results — and each one's plan on a group of
//! ranks, whichever way the ranks reach each other (their own jobs over host memory, or
//! one job for every rank on a GPU).

use coconet_core::Program;
use coconet_core::schedule::{Schedule, candidates};
use coconet_core::{Binding, Bindings};
use coconet_programs::{
    tp_bias_dropout_residual, tp_bias_dropout_residual_norm, tp_bias_residual, tp_gather, tp_max,
    tp_reduce_scatter, tp_sum,
};
use coconet_runtime::{JobData, Plan, RuntimeError};

/// A collective between the ranks of a tensor-parallel group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Collective {
    /// Elementwise sum of every rank's tensor, in rank order.
    Sum,
    /// Elementwise maximum of every rank's tensor.
    Max,
    /// Every rank's tensor, concatenated in rank order.
    Gather,
    /// This rank's block (of P equal blocks) of the elementwise sum of every rank's
    /// tensor.
    ReduceScatter,
    /// A row-parallel layer's epilogue: `residual + (Σ partial + bias)`, the bias `width`
    /// long.
    BiasResidual {
        /// The bias's length (the last dim).
        width: usize,
    },
    /// [`Collective::BiasResidual`] with dropout on `Σ partial + bias`; the probability
    /// and seed are the run's scalars `drop` and `seed`.
    BiasDropoutResidual {
        /// The bias's length (the last dim).
        width: usize,
    },
    /// [`Collective::BiasDropoutResidual`] and the layer norm of its result: two
    /// results, the residual stream `y` then its layer norm `n`.
    BiasDropoutResidualNorm {
        /// The bias's (and the norm's) length (the last dim).
        width: usize,
    },
}

/// The scalars of one run of a collective's program (the epilogue's dropout).
pub(crate) type Scalars<'a> = &'a [(&'a str, f64)];

impl Collective {
    /// The bias's length of an epilogue (`None` for the plain collectives).
    pub(crate) fn width(self) -> Option<usize> {
        match self {
            Collective::BiasResidual { width }
            | Collective::BiasDropoutResidual { width }
            | Collective::BiasDropoutResidualNorm { width } => Some(width),
            Collective::Sum | Collective::Max | Collective::Gather | Collective::ReduceScatter => {
                None
            }
        }
    }

    /// The program's input that takes each rank's own tensor.
    pub(crate) fn operand(self) -> &'static str {
        match self.width() {
            Some(_) => "p",
            None => "x",
        }
    }

    /// The program's other inputs, the same on every rank, in the order `run` takes them.
    pub(crate) fn replicated(self) -> &'static [&'static str] {
        match self {
            Collective::BiasResidual { .. } | Collective::BiasDropoutResidual { .. } => &["b", "r"],
            Collective::BiasDropoutResidualNorm { .. } => &["b", "r", "gamma", "beta"],
            Collective::Sum | Collective::Max | Collective::Gather | Collective::ReduceScatter => {
                &[]
            }
        }
    }

    /// The program's results, in the order a run gives them (one after the other, each
    /// as long as the first).
    pub(crate) fn outputs(self) -> &'static [&'static str] {
        match self {
            Collective::BiasDropoutResidualNorm { .. } => &["y", "n"],
            _ => &["y"],
        }
    }
}

/// Whose data a collective's bindings hold: this rank's (a rank of many processes or
/// threads) or every rank's (one job with every rank virtual, on a GPU).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holds {
    ThisRank,
    EveryRank,
}

/// The plan and bindings (zeros: the data comes with each run) of collective `what` over
/// tensors of `len` elements per rank on `ranks` ranks.
pub(crate) fn collective_plan(
    what: Collective,
    len: usize,
    ranks: usize,
    holds: Holds,
) -> Result<(Plan, Bindings), RuntimeError> {
    let zeros = |n: usize| vec![0f32; n];
    // A Local value: `n` elements on each rank.
    let local = |n: usize| match holds {
        Holds::ThisRank => Binding::this_rank(&zeros(n)),
        Holds::EveryRank => Binding::per_rank(&vec![zeros(n); ranks]),
    };
    // A Sliced value: a block of `n` elements on each rank.
    let block = |n: usize| match holds {
        Holds::ThisRank => Binding::this_rank(&zeros(n)),
        Holds::EveryRank => Binding::global(&zeros(n * ranks)),
    };
    let mut bindings = Bindings::new();
    let (program, total) = match what {
        Collective::Sum => (tp_sum().program().clone(), len),
        Collective::Max => (tp_max().program().clone(), len),
        Collective::Gather => (
            tp_gather().program().clone(),
            len.checked_mul(ranks).ok_or_else(|| {
                RuntimeError::Plan(format!(
                    "gathering {len} elements from {ranks} ranks overflows"
                ))
            })?,
        ),
        Collective::ReduceScatter => {
            if !len.is_multiple_of(ranks) {
                return Err(RuntimeError::Plan(format!(
                    "a reduce-scatter of {len} elements into {ranks} equal blocks"
                )));
            }
            (tp_reduce_scatter().program().clone(), len)
        }
        Collective::BiasResidual { width }
        | Collective::BiasDropoutResidual { width }
        | Collective::BiasDropoutResidualNorm { width } => {
            if width == 0 || !len.is_multiple_of(width) {
                return Err(RuntimeError::Plan(format!(
                    "a row-parallel epilogue over {len} elements with a bias of {width}"
                )));
            }
            bindings = bindings
                .dim("T", len / width)
                .dim("H", width)
                .tensor("b", Binding::global(&zeros(width)))
                .tensor("r", Binding::global(&zeros(len)));
            match what {
                Collective::BiasResidual { .. } => (tp_bias_residual().program().clone(), len),
                Collective::BiasDropoutResidual { .. } => {
                    bindings = bindings.scalar("drop", 0f32).scalar("seed", 0i64);
                    (tp_bias_dropout_residual().program().clone(), len)
                }
                _ => {
                    bindings = bindings
                        .scalar("drop", 0f32)
                        .scalar("seed", 0i64)
                        .tensor("gamma", Binding::global(&zeros(width)))
                        .tensor("beta", Binding::global(&zeros(width)))
                        .tensor("n", Binding::global(&zeros(len)));
                    (tp_bias_dropout_residual_norm().program().clone(), len)
                }
            }
        }
    };
    if what.width().is_none() {
        bindings = bindings.dim("N", total);
    }
    let out = match what {
        Collective::ReduceScatter => block(len / ranks),
        _ => Binding::global(&zeros(total)),
    };
    let operand = match what {
        Collective::Gather => block(len),
        _ => local(len),
    };
    let bindings = bindings.tensor(what.operand(), operand).tensor("y", out);
    let schedule = match what.width() {
        // The epilogue on each rank's block of the sum, between the reduce-scatter and
        // the all-gather (the paper's fused schedule).
        Some(_) => fused(&program),
        None => Schedule::new(&program),
    };
    let plan = Plan::lower(&schedule, ranks, bindings.dims())?;
    Ok((plan, bindings))
}

/// `program`'s all-reduce split into a reduce-scatter and an all-gather with the
/// elementwise work between them fused into one pass over each rank's block.
fn fused(program: &Program) -> Schedule {
    candidates(program, &[])
        .into_iter()
        .min_by_key(|s| match s.name() {
            "fuse(RS-C-AG)" => 0,
            "RS-C-AG" => 1,
            _ => 2,
        })
        .expect("the program as written is always a candidate")
}

/// Sets scalar `name` of a collective's job (the epilogue's dropout probability and seed).
pub(crate) fn set_scalar(
    job: &mut impl JobData,
    name: &str,
    value: f64,
) -> Result<(), RuntimeError> {
    let id = job.plan().program().find(name).ok_or_else(|| {
        RuntimeError::Plan(format!(
            "a tensor-parallel collective has no scalar `{name}`"
        ))
    })?;
    job.set_scalar_value(id, value)
}
