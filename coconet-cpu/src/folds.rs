//! Full reductions of a kernel's stages, folded chunk by chunk as the kernel computes
//! them (a fused all-reduce's partial norms): the reference order ([`ReduceAcc`]) does
//! not depend on how the elements are cut into chunks, so each result is bitwise the
//! separate reduction's, and the reduced stage never goes to memory.

use super::kernel::{Kernel, round};
use super::rank_context::Ctx;
use coconet_core::numerics::ReduceAcc;
use coconet_core::{Op, Program, ValueId};

/// The reductions of one kernel run, in progress.
pub(crate) struct Folds {
    items: Vec<Fold>,
    /// A chunk of a stage, as f64 (allocated only for stages not held as f32).
    buf: Vec<f64>,
}

struct Fold {
    value: ValueId,
    stage: usize,
    acc: ReduceAcc,
    folded: usize,
}

impl Folds {
    /// Folds for `reductions` (full reductions of stages of `kernel`).
    pub fn new(p: &Program, reductions: &[ValueId], kernel: &Kernel) -> Folds {
        let items = reductions
            .iter()
            .map(|&value| {
                let Op::ReduceAll(kind, x) = p.node(value).op else {
                    unreachable!("folded reductions are full reductions")
                };
                Fold {
                    value,
                    stage: kernel
                        .index_of(x)
                        .expect("a folded reduction's operand is a kernel stage"),
                    acc: ReduceAcc::new(kind),
                    folded: 0,
                }
            })
            .collect();
        Folds {
            items,
            buf: Vec::new(),
        }
    }

    /// Folds the chunk the kernel just computed (its first `n` positions).
    pub fn chunk(&mut self, kernel: &Kernel, n: usize) {
        for f in &mut self.items {
            if let Some(values) = kernel.f32_values(f.stage, n) {
                f.acc.fold_f32(f.folded, values);
            } else {
                if self.buf.len() < n {
                    self.buf.resize(kernel.step.max(n), 0.0);
                }
                let buf = &mut self.buf[..n];
                kernel.load_f64(f.stage, n, buf);
                f.acc.fold(f.folded, buf);
            }
            f.folded += n;
        }
    }

    /// Writes every result (rounded to its dtype) into its memory on this rank.
    pub fn finish(&self, ctx: &Ctx) {
        let p = ctx.plan.program();
        for f in &self.items {
            let mut out = [f.acc.finish()];
            round(p.node(f.value).ty.dtype, &mut out);
            ctx.write(f.value, &out);
        }
    }
}
