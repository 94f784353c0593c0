//! What each step of a plan asks of the machine, counted from the plan alone: bytes
//! through memory, element-stages of pointwise work, elements reduced across ranks,
//! matmul flops and barriers — the byte model BENCHMARKS.md derives by hand, for every
//! step of every schedule.

use super::links::{Pattern, Transfer};
use coconet_core::Collective;
use coconet_core::numerics::tensor::numel;
use coconet_core::{DType, Op, ValueId};
use coconet_plan::plan::{FusedAllGather, FusedAllReduce, Plan, PlanStep, Storage};
use std::collections::BTreeSet;

/// The demands of one step, summed over the ranks that hold its values.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Demand {
    /// Bytes read and written in memory (a CPU's ranks share one memory system; a
    /// GPU's are its own HBM).
    pub memory_bytes: f64,
    /// What the busiest rank sends to its peers over links (priced only where peers'
    /// memory is not this memory: on one CPU their buffers are memory, counted above).
    pub link: Transfer,
    /// Element × stage evaluations of pointwise work.
    pub stage_elements: f64,
    /// The part of `stage_elements` in kernels compiled to machine code: computed per
    /// element in registers while the kernel's data streams, so it overlaps the step's
    /// memory traffic instead of adding to it.
    pub compiled_stage_elements: f64,
    /// Elements combined in rank-ordered reductions across ranks (one per element per
    /// source: the collectives' reductions).
    pub reduced_elements: f64,
    /// The part of `reduced_elements` that compiled code sums in the loop of the
    /// kernel it feeds (a fused all-reduce's, see `cpu::kernel::Reduction`): it overlaps
    /// the memory traffic as compiled stages do.
    pub compiled_reduced_elements: f64,
    /// Elements summed into full reductions to one value (norms, `reduce_all`: a
    /// blocked tree in f64, not the collectives' element-wise sums).
    pub full_reduced_elements: f64,
    /// Element-stages and reduced elements of f16 or bf16 values: each also converted
    /// between the half type and the f32 or f64 it is computed in.
    pub half_conversions: f64,
    /// Elements of dropout stages (a Philox draw each: far dearer than a stage).
    pub dropout_elements: f64,
    /// Elements of layer norms (a row's mean and variance in f64, then the normalised
    /// value: several passes per element).
    pub layer_norm_elements: f64,
    /// Multiply-adds ×2 of matmuls with f32 or wider operands.
    pub flops: f64,
    /// Multiply-adds ×2 of matmuls with f16 or bf16 operands.
    pub half_flops: f64,
    /// Operand and result elements of matmuls with f32 or wider operands (each
    /// converted between the buffer's dtype and the product's working precision).
    pub matmul_elements: f64,
    /// The same for matmuls with f16 or bf16 operands.
    pub half_matmul_elements: f64,
    /// Barriers (each collective and fused collective is bracketed by two).
    pub barriers: f64,
    /// Ranks that work in this step (a pipeline stage's group, not every rank): the
    /// work spreads over at most these.
    pub busy_ranks: f64,
}

impl Demand {
    fn add(&mut self, o: &Demand) {
        self.memory_bytes += o.memory_bytes;
        self.link.bytes += o.link.bytes;
        self.link.hops += o.link.hops;
        if self.link.pattern != o.link.pattern {
            // Mixed patterns (an overlap's parts): priced as a ring, which every
            // collective can run as.
            self.link.pattern = Pattern::Ring;
        }
        self.stage_elements += o.stage_elements;
        self.compiled_stage_elements += o.compiled_stage_elements;
        self.reduced_elements += o.reduced_elements;
        self.compiled_reduced_elements += o.compiled_reduced_elements;
        self.full_reduced_elements += o.full_reduced_elements;
        self.half_conversions += o.half_conversions;
        self.dropout_elements += o.dropout_elements;
        self.layer_norm_elements += o.layer_norm_elements;
        self.flops += o.flops;
        self.half_flops += o.half_flops;
        self.matmul_elements += o.matmul_elements;
        self.half_matmul_elements += o.half_matmul_elements;
        self.barriers += o.barriers;
        self.busy_ranks = self.busy_ranks.max(o.busy_ranks);
    }
}

/// What every step of `plan` asks of the machine, in order (summed over the ranks that
/// hold its values; see [`Demand`]).
pub fn demands(plan: &Plan) -> Vec<Demand> {
    plan.steps().iter().map(|s| demands_of(plan, s)).collect()
}

/// Bytes of every buffer of `plan` on every rank: its tensor inputs where a rank holds
/// them, and its runtime buffers.
pub(crate) fn footprint(plan: &Plan) -> f64 {
    let p = plan.program();
    let inputs: f64 = p
        .ids()
        .filter(|&v| p.node(v).op == Op::TensorInput)
        .map(|t| {
            let size = p.node(t).ty.dtype.size_bytes() as f64;
            plan.holders(t)
                .map(|r| numel(&plan.local_shape(t, r)) as f64 * size)
                .sum::<f64>()
        })
        .sum();
    let slots: f64 = plan
        .slots()
        .iter()
        .map(|s| s.elements.iter().sum::<usize>() as f64 * s.dtype.size_bytes() as f64)
        .sum();
    inputs + slots
}

pub(crate) fn demands_of(plan: &Plan, step: &PlanStep) -> Demand {
    let p = plan.program();
    let mut d = Demand::default();
    // Sums `f(rank)` over the ranks that hold `v`.
    let over = |v: ValueId, f: &dyn Fn(usize) -> f64| plan.holders(v).map(f).sum::<f64>();
    let elems = |v: ValueId, r: usize| numel(&plan.local_shape(v, r)) as f64;
    let bytes = |v: ValueId, r: usize| elems(v, r) * p.node(v).ty.dtype.size_bytes() as f64;
    let in_memory = |v: ValueId| {
        matches!(
            plan.storage(v),
            Some(Storage::Input(_) | Storage::Slot(_) | Storage::View { .. })
        ) && !p.node(v).ty.is_scalar()
    };
    match step {
        PlanStep::Uniform(_) => {}
        PlanStep::Kernel(members) => {
            d = kernel(plan, members, &[]);
        }
        PlanStep::Op(v) => {
            let v = *v;
            let node = p.node(v);
            let q = plan.group_size() as f64;
            match &node.op {
                Op::Collective(Collective::AllReduce(_), x) => {
                    // My block reduced from every peer, then every peer's block copied.
                    let x = *x;
                    d.memory_bytes = over(x, &|r| {
                        bytes(x, r) * (1.0 + 1.0 / q + 2.0 * (1.0 - 1.0 / q))
                    });
                    d.reduced_elements = over(x, &|r| elems(x, r));
                    if is_half(p.node(x).ty.dtype) {
                        d.half_conversions = d.reduced_elements;
                    }
                    d.link = Transfer {
                        bytes: bytes(x, plan.holders(x).start) * 2.0 * (q - 1.0) / q,
                        hops: 2.0 * (q - 1.0),
                        pattern: Pattern::AllReduce,
                    };
                    d.barriers = 2.0;
                }
                Op::Collective(Collective::ReduceScatter(_, _), x) => {
                    let x = *x;
                    d.memory_bytes = over(x, &|r| bytes(x, r) * (1.0 + 1.0 / q));
                    d.reduced_elements = over(x, &|r| elems(x, r));
                    if is_half(p.node(x).ty.dtype) {
                        d.half_conversions = d.reduced_elements;
                    }
                    d.link = ring(bytes(x, plan.holders(x).start) * (q - 1.0) / q, q - 1.0);
                    d.barriers = 2.0;
                }
                Op::Collective(Collective::Send(_), _) => {
                    // Each rank of the group sends its tensor to its peer of the next.
                    d.memory_bytes = over(v, &|r| 2.0 * bytes(v, r));
                    d.link = Transfer {
                        bytes: bytes(v, plan.holders(v).start),
                        hops: 1.0,
                        pattern: Pattern::Send,
                    };
                    d.barriers = 2.0;
                }
                Op::Collective(Collective::AllGather, _)
                | Op::Collective(Collective::Broadcast(_), _) => {
                    d.memory_bytes = over(v, &|r| 2.0 * bytes(v, r));
                    d.link = ring(bytes(v, plan.holders(v).start) * (q - 1.0) / q, q - 1.0);
                    d.barriers = 2.0;
                }
                Op::Collective(Collective::Reduce(_, _), x) => {
                    let x = *x;
                    d.memory_bytes = over(x, &|r| 2.0 * bytes(x, r));
                    d.reduced_elements = over(x, &|r| elems(x, r));
                    if is_half(p.node(x).ty.dtype) {
                        d.half_conversions = d.reduced_elements;
                    }
                    d.link = ring(bytes(x, plan.holders(x).start), q - 1.0);
                    d.barriers = 2.0;
                }
                Op::MatMul(a, b) => {
                    let (a, b) = (*a, *b);
                    let flops = over(v, &|r| {
                        let k = *plan.local_shape(b, r).first().unwrap_or(&1) as f64;
                        2.0 * elems(v, r) * k
                    });
                    let elements = over(v, &|r| elems(a, r) + elems(b, r) + elems(v, r));
                    if matches!(p.node(a).ty.dtype, DType::F16 | DType::BF16) {
                        (d.half_flops, d.half_matmul_elements) = (flops, elements);
                    } else {
                        (d.flops, d.matmul_elements) = (flops, elements);
                    }
                    d.memory_bytes = over(v, &|r| bytes(a, r) + bytes(b, r) + bytes(v, r));
                }
                Op::ReduceAll(_, x) => {
                    let x = *x;
                    d.memory_bytes = over(x, &|r| bytes(x, r));
                    d.full_reduced_elements = over(x, &|r| elems(x, r));
                    if is_half(p.node(x).ty.dtype) {
                        d.half_conversions = d.full_reduced_elements;
                    }
                }
                Op::Scatter(..) => {}
                Op::TensorInput
                | Op::ScalarInput
                | Op::Literal(_)
                | Op::Unary(..)
                | Op::Binary(..)
                | Op::Select(..)
                | Op::Cast(_)
                | Op::Dropout { .. }
                | Op::LayerNorm { .. }
                | Op::Update { .. } => {
                    // Other single operations (layer norm, ...): read the operands, write
                    // the result, a few stages per element.
                    let reads: f64 = node
                        .op
                        .operands()
                        .into_iter()
                        .filter(|&o| in_memory(o))
                        .map(|o| over(o, &|r| bytes(o, r)))
                        .sum();
                    d.memory_bytes = reads + over(v, &|r| bytes(v, r));
                    if matches!(node.op, Op::LayerNorm { .. }) {
                        // One stage plus its row statistics, as in a kernel.
                        d.stage_elements = over(v, &|r| elems(v, r));
                        d.layer_norm_elements = over(v, &|r| elems(v, r));
                    } else {
                        d.stage_elements = 4.0 * over(v, &|r| elems(v, r));
                    }
                }
            }
        }
        PlanStep::FusedAllReduce(f) => d = fused(plan, f),
        PlanStep::FusedAllGather(f) => d = fused_gather(plan, f),
        PlanStep::Overlap { matmul, consumer } => {
            // Summed here; the prediction overlaps them (see `predict`).
            d = demands_of(plan, &PlanStep::Op(*matmul));
            d.add(&fused(plan, consumer));
        }
        PlanStep::Commit { target, .. } => {
            let t = *target;
            d.memory_bytes = over(t, &|r| 2.0 * bytes(t, r));
        }
    }
    if d.busy_ranks == 0.0 {
        d.busy_ranks = busy(plan, step) as f64;
    }
    d
}

/// Whether values of `d` are computed in a wider type and converted on every pass.
fn is_half(d: DType) -> bool {
    matches!(d, DType::F16 | DType::BF16)
}

/// A ring transfer of `bytes` over `hops` hops.
fn ring(bytes: f64, hops: f64) -> Transfer {
    Transfer {
        bytes,
        hops,
        pattern: Pattern::Ring,
    }
}

/// The ranks that hold the values a step computes.
fn busy(plan: &Plan, step: &PlanStep) -> usize {
    let v = match step {
        PlanStep::Uniform(_) => return 1,
        PlanStep::Kernel(members) => members.last().copied(),
        PlanStep::Op(v) => Some(*v),
        PlanStep::FusedAllReduce(f) => Some(f.reduce_scatter),
        PlanStep::FusedAllGather(f) => f.kernel.last().copied(),
        PlanStep::Overlap { matmul, .. } => Some(*matmul),
        PlanStep::Commit { target, .. } => Some(*target),
    };
    v.map_or(1, |v| plan.holders(v).len().max(1))
}

/// A pointwise kernel over `members` (values in `preset` arrive in registers): every
/// memory operand read once, every stored member written once.
fn kernel(plan: &Plan, members: &[ValueId], preset: &[ValueId]) -> Demand {
    let p = plan.program();
    let mut d = Demand::default();
    let inside: BTreeSet<ValueId> = members.iter().chain(preset).copied().collect();
    let Some(&last) = members.last() else {
        return d;
    };
    let compiled = coconet_cpu::for_tuning::compiles(p, preset, members);
    let mut operands = BTreeSet::new();
    for &m in members {
        for o in p.node(m).op.operands() {
            if !inside.contains(&o)
                && !p.node(o).ty.is_scalar()
                && matches!(
                    plan.storage(o),
                    Some(Storage::Input(_) | Storage::Slot(_) | Storage::View { .. })
                )
            {
                operands.insert(o);
            }
        }
    }
    for r in plan.holders(last) {
        let size = |v: ValueId| numel(&plan.local_shape(v, r)) as f64;
        let bytes = |v: ValueId| size(v) * p.node(v).ty.dtype.size_bytes() as f64;
        // An operand is read over the kernel's iteration space: a Replicated tensor in a
        // kernel on my block only that block, a broadcast bias only itself.
        d.memory_bytes += operands
            .iter()
            .map(|&o| size(o).min(size(last)) * p.node(o).ty.dtype.size_bytes() as f64)
            .sum::<f64>();
        // Each buffer the kernel writes, once: a value and the update that stores it
        // share the input's buffer (both stored there when the value is also read).
        let mut written = Vec::new();
        for &m in members {
            if let Some(at @ (Storage::Input(_) | Storage::Slot(_))) = plan.storage(m)
                && !written.contains(&at)
            {
                written.push(at);
                d.memory_bytes += bytes(m);
            }
        }
        d.stage_elements += size(last) * members.len() as f64;
        if compiled {
            d.compiled_stage_elements += size(last) * members.len() as f64;
        }
        d.half_conversions += size(last)
            * members
                .iter()
                .filter(|&&m| is_half(p.node(m).ty.dtype))
                .count() as f64;
        let elements_of = |what: fn(&Op) -> bool| -> f64 {
            members
                .iter()
                .filter(|&&m| what(&p.node(m).op))
                .map(|&m| size(m))
                .sum()
        };
        d.dropout_elements += elements_of(|op| matches!(op, Op::Dropout { .. }));
        d.layer_norm_elements += elements_of(|op| matches!(op, Op::LayerNorm { .. }));
    }
    d
}

/// A fused all-reduce: every rank reduces its block of the operand from every peer,
/// runs the kernel on it, stores the sliced results and writes the gathered ones into
/// every peer.
fn fused(plan: &Plan, f: &FusedAllReduce) -> Demand {
    let p = plan.program();
    let x = f.operand;
    let q = plan.group_size() as f64;
    // Updates of gathered values are written by the gathers (counted below).
    let mut d = kernel(plan, &f.kernel, &[f.reduce_scatter]);
    let b = |v: ValueId, r: usize| {
        numel(&plan.local_shape(v, r)) as f64 * p.node(v).ty.dtype.size_bytes() as f64
    };
    // The kernel's compiled code sums f32 operands itself (in rank order, in f64) where
    // it has stages of its own to compute.
    let rs = f.reduce_scatter;
    let reduced_in_code = coconet_cpu::for_tuning::reduces_in_code(p, f.op, rs, &f.kernel);
    for r in plan.holders(x) {
        d.memory_bytes += b(x, r); // P blocks of n/P
        d.reduced_elements += numel(&plan.local_shape(x, r)) as f64;
        if reduced_in_code {
            d.compiled_reduced_elements += numel(&plan.local_shape(x, r)) as f64;
        }
        if is_half(p.node(x).ty.dtype) {
            d.half_conversions += numel(&plan.local_shape(x, r)) as f64;
        }
        // Folded full reductions: my block summed into each (the f64 blocked tree a
        // separate reduction runs, on the kernel's registers instead of memory).
        d.full_reduced_elements +=
            numel(&plan.local_shape(f.reduce_scatter, r)) as f64 * f.reductions.len() as f64;
        for g in &f.gathers {
            d.memory_bytes += b(g.gather, r); // my block written into every peer
        }
    }
    let first = plan.holders(x).start;
    // One ring pass reduce-scatters and another gathers: an all-reduce's hops, never a
    // tree (the update runs between the two passes, on each rank's block).
    d.link = ring(
        (b(x, first) + f.gathers.iter().map(|g| b(g.gather, first)).sum::<f64>()) * (q - 1.0) / q,
        2.0 * (q - 1.0),
    );
    d.barriers = 2.0;
    d
}

/// A fused all-gather: the kernel on my block, its gathered results written into every
/// peer (the gathered values never stored in a buffer of mine and read back).
fn fused_gather(plan: &Plan, f: &FusedAllGather) -> Demand {
    let p = plan.program();
    let q = plan.group_size() as f64;
    let mut d = kernel(plan, &f.kernel, &[]);
    let b = |v: ValueId, r: usize| {
        numel(&plan.local_shape(v, r)) as f64 * p.node(v).ty.dtype.size_bytes() as f64
    };
    for g in &f.gathers {
        d.memory_bytes += plan.holders(g.gather).map(|r| b(g.gather, r)).sum::<f64>();
    }
    let gathered: f64 = f
        .gathers
        .iter()
        .map(|g| b(g.gather, plan.holders(g.gather).start))
        .sum();
    d.link = ring(gathered * (q - 1.0) / q, q - 1.0);
    d.barriers = 2.0;
    d
}
