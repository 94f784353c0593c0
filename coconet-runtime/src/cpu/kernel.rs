//! Pointwise kernels evaluated over chunks of an iteration space: every stage of the
//! kernel is computed for a whole chunk before the next (interpretation cost per chunk,
//! not per element; the inner loops are plain slices the compiler vectorises). Values
//! are computed in f64 and rounded to each stage's dtype, exactly as the reference
//! interpreter does, so kernels agree with it bit for bit.

use super::array::Mapping;
use super::exec::Ctx;
use coconet_core::interp::philox::{dropout_bits, dropout_threshold};
use coconet_core::{BinaryOp, DType, Layout, Op, UnaryOp, ValueId, block_range, layer_norm_row};

/// Chunk length (elements): registers of a whole kernel stay in L2.
pub const CHUNK: usize = 2048;

/// The chunk length of a kernel over `members` with iteration space `shape`: a multiple
/// of the row when a stage works on rows (computable without any buffer).
pub fn step_for(p: &coconet_core::Program, members: &[ValueId], shape: &[usize]) -> usize {
    let rows = members
        .iter()
        .any(|&m| matches!(p.node(m).op, Op::LayerNorm { .. }));
    let row = if rows {
        shape.last().copied().unwrap_or(1).max(1)
    } else {
        1
    };
    (CHUNK / row).max(1) * row
}

/// Where a stage's operand comes from during a kernel.
#[derive(Debug, Clone)]
pub enum Src {
    /// A register: an earlier stage of the same kernel (index into the stages).
    Reg(usize),
    /// Memory (or a constant).
    Mem(Mapping),
}

/// One stage of a kernel, ready to run on this rank.
#[derive(Debug, Clone)]
pub struct Stage {
    pub id: ValueId,
    pub op: Op,
    pub dtype: DType,
    pub srcs: Vec<Src>,
    /// Where to store each chunk (None: register only).
    pub store: Option<Mapping>,
    /// For dropout: (logical index of local position 0 along the sliced dim, the
    /// sliced dim, the logical shape) — to recover logical element indices.
    pub logical: Option<(usize, usize, Vec<usize>)>,
}

/// A kernel prepared for one rank.
#[derive(Debug)]
pub struct Kernel {
    pub stages: Vec<Stage>,
    /// The first `preset` stages are filled by the caller (e.g. a reduced chunk).
    preset: usize,
    pub len: usize,
    pub shape: Vec<usize>,
    /// Chunk length: a multiple of the row length when a stage works on rows.
    pub step: usize,
    regs: Vec<Vec<f64>>,
    tmp: Vec<Vec<f64>>,
}

impl Kernel {
    /// Prepares `members` (pointwise stages with one iteration space) for rank `ctx.rank`;
    /// `preset` are values already in registers (e.g. a reduced chunk), listed first.
    pub fn new(ctx: &Ctx, preset: &[ValueId], members: &[ValueId], shape: Vec<usize>) -> Kernel {
        let p = ctx.plan.program();
        let mut ids: Vec<ValueId> = preset.to_vec();
        let mut stages = Vec::new();
        for &pre in preset {
            let n = p.node(pre);
            stages.push(Stage {
                id: pre,
                op: n.op.clone(),
                dtype: n.ty.dtype,
                srcs: vec![],
                store: None,
                logical: None,
            });
        }
        for &m in members {
            let node = p.node(m);
            let srcs = node
                .op
                .operands()
                .into_iter()
                .map(|o| match ids.iter().position(|&i| i == o) {
                    Some(i) => Src::Reg(i),
                    None => Src::Mem(ctx.operand_mapping(m, o, &shape)),
                })
                .collect();
            let store = ctx.store_mapping(m, &shape);
            let logical = match node.op {
                Op::Dropout { .. } => Some(ctx.logical_origin(m)),
                _ => None,
            };
            stages.push(Stage {
                id: m,
                op: node.op.clone(),
                dtype: node.ty.dtype,
                srcs,
                store,
                logical,
            });
            ids.push(m);
        }
        let len = shape.iter().product();
        let n = stages.len();
        let step = step_for(ctx.plan.program(), members, &shape);
        Kernel {
            stages,
            preset: preset.len(),
            len,
            shape,
            step,
            regs: vec![vec![0.0; step]; n],
            tmp: vec![vec![0.0; step]; 4],
        }
    }

    /// The register of stage `i` for the current chunk.
    pub fn reg_mut(&mut self, i: usize) -> &mut [f64] {
        &mut self.regs[i]
    }

    /// The register of stage `i`.
    pub fn reg(&self, i: usize) -> &[f64] {
        &self.regs[i]
    }

    /// Index of the stage computing `v`.
    pub fn index_of(&self, v: ValueId) -> Option<usize> {
        self.stages.iter().position(|s| s.id == v)
    }

    /// Runs the whole iteration space.
    pub fn run(&mut self) {
        let mut start = 0;
        while start < self.len {
            let n = self.step.min(self.len - start);
            self.chunk(start, n);
            start += n;
        }
    }

    /// Computes and stores positions `start..start + n` (n ≤ step); preset registers
    /// must already hold this chunk.
    pub fn chunk(&mut self, start: usize, n: usize) {
        for i in self.preset..self.stages.len() {
            let (done, rest) = self.regs.split_at_mut(i);
            let out = &mut rest[0][..n];
            let stage = &self.stages[i];
            // Fetch memory operands into temporaries.
            for (k, s) in stage.srcs.iter().enumerate() {
                if let Src::Mem(m) = s {
                    m.load(start, &mut self.tmp[k][..n]);
                }
            }
            let arg = |k: usize| -> &[f64] {
                match &stage.srcs[k] {
                    Src::Reg(j) => &done[*j][..n],
                    Src::Mem(_) => &self.tmp[k][..n],
                }
            };
            compute(stage, start, &self.shape, &arg, out);
            round(stage.dtype, out);
            if let Some(store) = &stage.store
                && let Mapping::Contiguous { raw, base } = store
            {
                raw.store(base + start, out);
            }
        }
    }
}

fn compute<'a>(
    stage: &Stage,
    start: usize,
    shape: &[usize],
    arg: &dyn Fn(usize) -> &'a [f64],
    out: &mut [f64],
) {
    match stage.op {
        Op::Unary(op, _) => unary(op, arg(0), out),
        Op::Binary(op, ..) => binary(op, arg(0), arg(1), out, stage.dtype.is_int()),
        Op::Select(..) => {
            let (c, a, b) = (arg(0), arg(1), arg(2));
            for i in 0..out.len() {
                out[i] = if c[i] != 0.0 { a[i] } else { b[i] };
            }
        }
        Op::Cast(_) => out.copy_from_slice(arg(0)),
        Op::Update { .. } => out.copy_from_slice(arg(1)),
        Op::LayerNorm { .. } => {
            // Chunks hold whole rows; gamma and beta are mapped per position.
            let h = shape.last().copied().unwrap_or(1).max(1);
            let (x, g, b, e) = (arg(0), arg(1), arg(2), arg(3)[0]);
            for (r, o) in out.chunks_mut(h).enumerate() {
                let span = r * h..(r + 1) * h;
                layer_norm_row(&x[span.clone()], &g[span.clone()], &b[span], e, o);
            }
        }
        Op::Dropout { .. } => {
            let (x, p, seed) = (arg(0), arg(1)[0], arg(2)[0]);
            let threshold = dropout_threshold(p);
            let scale = 1.0 / (1.0 - p);
            let seed = seed as i64 as u64;
            let (origin, dim, ref full) = *stage.logical.as_ref().expect("dropout origin");
            for (j, o) in out.iter_mut().enumerate() {
                let g = logical_index(start + j, shape, full, dim, origin);
                let keep = dropout_bits(seed, g as u64) as u64 >= threshold;
                *o = if keep { x[j] * scale } else { 0.0 };
            }
        }
        ref op => unreachable!("{} is not a kernel stage", op.name()),
    }
}

/// Logical index of local position `i` of a value whose local block (shape `local`)
/// starts at `origin` along `dim` of the logical shape `full`.
fn logical_index(i: usize, local: &[usize], full: &[usize], dim: usize, origin: usize) -> usize {
    if origin == 0 && local == full {
        return i;
    }
    let strides = super::array::strides(local);
    let mut rem = i;
    let mut g = 0;
    for k in 0..local.len() {
        let idx = rem / strides[k].max(1);
        rem %= strides[k].max(1);
        let idx = if k == dim { idx + origin } else { idx };
        g = g * full[k] + idx;
    }
    g
}

fn unary(op: UnaryOp, x: &[f64], out: &mut [f64]) {
    match op {
        UnaryOp::Neg => out.iter_mut().zip(x).for_each(|(o, a)| *o = -a),
        UnaryOp::Abs => out.iter_mut().zip(x).for_each(|(o, a)| *o = a.abs()),
        UnaryOp::Sqrt => out.iter_mut().zip(x).for_each(|(o, a)| *o = a.sqrt()),
        UnaryOp::Relu => out.iter_mut().zip(x).for_each(|(o, a)| *o = a.max(0.0)),
        op => out.iter_mut().zip(x).for_each(|(o, a)| *o = op.eval(*a)),
    }
}

fn binary(op: BinaryOp, a: &[f64], b: &[f64], out: &mut [f64], int: bool) {
    let zip = a.iter().zip(b).zip(out.iter_mut());
    match op {
        BinaryOp::Add => zip.for_each(|((x, y), o)| *o = x + y),
        BinaryOp::Sub => zip.for_each(|((x, y), o)| *o = x - y),
        BinaryOp::Mul => zip.for_each(|((x, y), o)| *o = x * y),
        BinaryOp::Div if !int => zip.for_each(|((x, y), o)| *o = x / y),
        BinaryOp::Min => zip.for_each(|((x, y), o)| *o = x.min(*y)),
        BinaryOp::Max => zip.for_each(|((x, y), o)| *o = x.max(*y)),
        op => zip.for_each(|((x, y), o)| *o = op.eval(*x, *y, int)),
    }
}

/// Rounds a chunk to a dtype (f64: nothing; f32: one conversion per element).
pub fn round(dtype: DType, out: &mut [f64]) {
    match dtype {
        DType::F64 => {}
        DType::F32 => out.iter_mut().for_each(|x| *x = *x as f32 as f64),
        d => out.iter_mut().for_each(|x| *x = d.round(*x)),
    }
}

/// The origin of a value's local block in logical coordinates: (start along the sliced
/// dim, the dim, the logical shape).
pub fn origin(
    full: &[usize],
    layout: Layout,
    group_size: usize,
    rank_in_group: usize,
) -> (usize, usize, Vec<usize>) {
    match layout {
        Layout::Sliced(d) => (
            block_range(full[d], group_size, rank_in_group).start,
            d,
            full.to_vec(),
        ),
        _ => (0, 0, full.to_vec()),
    }
}
