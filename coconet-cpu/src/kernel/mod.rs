//! Pointwise kernels evaluated over chunks of an iteration space. Where a kernel is all
//! f32 arithmetic it runs as machine code compiled for it ([`compiled`], feature `jit`):
//! every stage of an element in vector registers, one pass over memory. Otherwise every
//! stage of the kernel is computed for a whole chunk before the next (interpretation
//! cost per chunk, not per element; the inner loops are plain slices the compiler
//! vectorises). Values are computed in f64 and rounded to each stage's dtype, exactly as
//! the reference interpreter does, or in f32 where that gives the same bits (see
//! [`Kernel`]), so kernels agree with it bit for bit on either path.

use super::array::Mapping;
use super::rank_context::Ctx;
use coconet_core::numerics::layer_norm_row;
use coconet_core::numerics::philox::{dropout_bits, dropout_bits_x8, dropout_threshold};
use coconet_core::{BinaryOp, DType, Op, UnaryOp, ValueId};
use coconet_plan::host::memory::Raw;
#[cfg(feature = "jit")]
use compiled::{Compiled, read_outside};
#[cfg(feature = "jit")]
use stage::View;
use stage::is_narrow;
pub(crate) use stage::reduction_compiles;
pub use stage::{Reduction, Src, Stage};

#[cfg(feature = "jit")]
mod compiled;
mod stage;

/// The default chunk length (elements): registers of a whole kernel stay in L2.
pub const CHUNK: usize = 4096;

/// The chunk length of a kernel over `members` with iteration space `shape`, aiming at
/// `chunk` elements: a multiple of the row when a stage works on rows (computable
/// without any buffer).
pub fn step_for(
    p: &coconet_core::Program,
    members: &[ValueId],
    shape: &[usize],
    chunk: usize,
) -> usize {
    let rows = members
        .iter()
        .any(|&m| matches!(p.node(m).op, Op::LayerNorm { .. }));
    let row = if rows {
        shape.last().copied().unwrap_or(1).max(1)
    } else {
        1
    };
    (chunk.max(1) / row).max(1) * row
}

/// Whether a kernel over `members` (after `preset` values in registers) runs as compiled
/// code, as far as the program tells: every member either passes a kernel value on
/// unchanged (an update, or a cast to the dtype it has: see `Kernel::reg`) or is an f32
/// stage of the f32 path whose operation a graph expresses, every preset value narrow,
/// and compilation on. (How its operands lie in memory can still send it to the stage
/// loops: see `compiled`.) The cost model prices such a kernel's stages as overlapping
/// its memory traffic.
pub fn compiles(p: &coconet_core::Program, preset: &[ValueId], members: &[ValueId]) -> bool {
    #[cfg(feature = "jit")]
    {
        let mut kernel: Vec<ValueId> = preset.to_vec();
        super::jit::enabled()
            && preset.iter().all(|&v| is_narrow(p.node(v).ty.dtype))
            && members.iter().all(|&m| {
                let node = p.node(m);
                let ok = passes_on(p, m, |v| kernel.contains(&v)).is_some()
                    || (node.ty.dtype == DType::F32
                        && computes_in_f32(p, m)
                        && compiled::expressible(&node.op));
                kernel.push(m);
                ok
            })
    }
    #[cfg(not(feature = "jit"))]
    {
        let _ = (p, preset, members);
        false
    }
}

/// Whether a kernel over `members` after the `op`-reduced value `reduced` computes the
/// reduction in its code, as far as the program tells (`Kernel::reducing`; the cost
/// model prices that reduction as overlapping memory).
pub fn reduces_in_code(
    p: &coconet_core::Program,
    op: coconet_core::ReduceOp,
    reduced: ValueId,
    members: &[ValueId],
) -> bool {
    // A kernel with nothing to compute is not compiled.
    !members.is_empty()
        && reduction_compiles(op, p.node(reduced).ty.dtype)
        && compiles(p, &[reduced], members)
}

/// Whether stage `m` computes in f32 (see [`Kernel`]): a narrow stage whose operation is
/// exactly rounded, on narrow operands.
fn computes_in_f32(p: &coconet_core::Program, m: ValueId) -> bool {
    let node = p.node(m);
    is_narrow(node.ty.dtype)
        && node.op.is_exactly_rounded()
        && node
            .op
            .operands()
            .into_iter()
            .all(|o| is_narrow(p.node(o).ty.dtype))
}

/// The value whose values stage `m` passes on unchanged, if it is in a register
/// (`in_kernel`): an update's new value, or a cast's operand of the dtype it casts to
/// (rounding to the dtype they have changes none).
fn passes_on(
    p: &coconet_core::Program,
    m: ValueId,
    in_kernel: impl Fn(ValueId) -> bool,
) -> Option<ValueId> {
    let node = p.node(m);
    let from = match node.op {
        Op::Update { value, .. } | Op::Cast(value) => value,
        _ => return None,
    };
    (in_kernel(from) && p.node(from).ty.dtype == node.ty.dtype).then_some(from)
}

/// A kernel prepared for one rank.
///
/// Registers of stages stored as f32, f16 or bf16 hold f32 lanes (every value of those
/// dtypes is an f32), the others f64. A narrow stage whose operation is exactly rounded
/// (`+ - * /`, sqrt, min, max, negation, select, cast) on narrow operands computes in
/// f32: rounding the f32 result to the stage's dtype equals rounding the exact result,
/// since f32 keeps more than twice the bits of f16 and bf16 plus two (for f32 itself the
/// operation is the correctly rounded one). Every other stage computes in f64 and rounds,
/// as the interpreter does — so both paths agree with it bit for bit, and the common
/// case (an f32 optimizer) runs on twice as many SIMD lanes with no rounding passes.
#[derive(Debug)]
pub struct Kernel {
    pub stages: Vec<Stage>,
    /// Per stage: its registers are f32 lanes.
    narrow: Vec<bool>,
    /// Per stage: computed in f32 (see the type's docs).
    in_f32: Vec<bool>,
    /// Per stage: the stage whose register holds its values — its own, or, for an
    /// update or cast that passes an earlier stage's values on unchanged, that stage's
    /// (no pass over the chunk copies them).
    reg: Vec<usize>,
    /// The first `preset` stages are filled by the caller (e.g. a reduced chunk).
    preset: usize,
    pub len: usize,
    pub shape: Vec<usize>,
    /// Chunk length: a multiple of the row length when a stage works on rows.
    pub step: usize,
    /// Registers: `r32[i]` for narrow stages, `r64[i]` for the others (the other empty;
    /// both empty for a stage whose values are in another's register, see `reg`).
    r32: Vec<Vec<f32>>,
    r64: Vec<Vec<f64>>,
    /// Operand temporaries of each width, and the f64 result of a narrow stage.
    t32: Vec<Vec<f32>>,
    t64: Vec<Vec<f64>>,
    out64: Vec<f64>,
    /// The kernel as machine code, where it compiles (see [`Compiled`]).
    #[cfg(feature = "jit")]
    compiled: Option<Compiled>,
}

/// Registers and temporaries of this thread's finished kernels. A rank thread runs
/// the same kernels every step; allocating their half a MiB afresh each time (blocks
/// this large are mapped and unmapped by the allocator, then faulted in page by page)
/// cost more than a small step's whole work.
#[derive(Default)]
struct Spare {
    f32s: Vec<Vec<f32>>,
    f64s: Vec<Vec<f64>>,
}

thread_local! {
    static SPARE: std::cell::RefCell<Spare> = std::cell::RefCell::default();
}

/// A vector of `n` elements, reusing a spare one. Its contents are stale: every
/// register and temporary is written before it is read.
fn take<T: Copy + Default>(spare: &mut Vec<Vec<T>>, n: usize) -> Vec<T> {
    if n == 0 {
        return Vec::new();
    }
    let mut v = spare.pop().unwrap_or_default();
    v.resize(n, T::default());
    v
}

impl Drop for Kernel {
    fn drop(&mut self) {
        // `try_with`: a kernel dropped while its thread exits just frees its vectors.
        let _ = SPARE.try_with(|spare| {
            let Ok(mut spare) = spare.try_borrow_mut() else {
                return;
            };
            let keep32 = self.r32.drain(..).chain(self.t32.drain(..));
            spare.f32s.extend(keep32.filter(|v| v.capacity() > 0));
            let keep64 = self.r64.drain(..).chain(self.t64.drain(..));
            let out = std::mem::take(&mut self.out64);
            spare
                .f64s
                .extend(keep64.chain([out]).filter(|v| v.capacity() > 0));
        });
    }
}

impl Kernel {
    /// The stages and register layout its compiled code is made from.
    #[cfg(feature = "jit")]
    fn view(&self) -> View<'_> {
        View {
            stages: &self.stages,
            narrow: &self.narrow,
            in_f32: &self.in_f32,
            reg: &self.reg,
            preset: self.preset,
            len: self.len,
        }
    }

    /// Prepares `members` (pointwise stages with one iteration space) for rank `ctx.rank`;
    /// `preset` are values already in registers (e.g. a reduced chunk), listed first.
    pub fn new(ctx: &Ctx, preset: &[ValueId], members: &[ValueId], shape: Vec<usize>) -> Kernel {
        Kernel::reducing(ctx, preset, members, shape, None)
    }

    /// [`Kernel::new`], whose compiled code also computes the first preset stage as
    /// `reduction` where it can: one pass over the sources and the kernel's operands
    /// instead of a reduction pass into a register and a kernel pass reading it back.
    /// [`Kernel::reduces`] says whether it does (the caller then fills no register).
    pub fn reducing(
        ctx: &Ctx,
        preset: &[ValueId],
        members: &[ValueId],
        shape: Vec<usize>,
        reduction: Option<Reduction<'_>>,
    ) -> Kernel {
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
        let mut in_f32 = vec![false; preset.len()];
        let mut reg: Vec<usize> = (0..preset.len()).collect();
        for &m in members {
            let node = p.node(m);
            in_f32.push(computes_in_f32(p, m));
            let position = |v: ValueId| ids.iter().position(|&i| i == v);
            let srcs: Vec<Src> = node
                .op
                .operands()
                .into_iter()
                .map(|o| match position(o) {
                    Some(i) => Src::Reg(reg[i]),
                    None => Src::Mem(ctx.operand_mapping(m, o, &shape)),
                })
                .collect();
            let passed = passes_on(p, m, |v| position(v).is_some()).and_then(position);
            reg.push(passed.map_or(stages.len(), |i| reg[i]));
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
        let step = step_for(ctx.plan.program(), members, &shape, ctx.chunk);
        let narrow: Vec<bool> = stages.iter().map(|s| is_narrow(s.dtype)).collect();
        // Registers only for stages that hold their own values.
        let sized = |i: usize, yes: bool| if yes && reg[i] == i { step } else { 0 };
        let (r32, r64, t32, t64, out64) = SPARE.with(|spare| {
            let spare = &mut *spare.borrow_mut();
            let (f32s, f64s) = (&mut spare.f32s, &mut spare.f64s);
            (
                (0..stages.len())
                    .map(|i| take(f32s, sized(i, narrow[i])))
                    .collect(),
                (0..stages.len())
                    .map(|i| take(f64s, sized(i, !narrow[i])))
                    .collect(),
                (0..4).map(|_| take(f32s, step)).collect(),
                (0..4).map(|_| take(f64s, step)).collect(),
                take(f64s, step),
            )
        });
        #[cfg(not(feature = "jit"))]
        let _ = reduction;
        #[cfg_attr(not(feature = "jit"), allow(unused_mut))]
        let mut kernel = Kernel {
            r32,
            r64,
            t32,
            t64,
            out64,
            stages,
            narrow,
            in_f32,
            reg,
            preset: preset.len(),
            len,
            shape,
            step,
            #[cfg(feature = "jit")]
            compiled: None,
        };
        #[cfg(feature = "jit")]
        {
            let live = read_outside(p, &ids);
            kernel.compiled = reduction
                .and_then(|r| Compiled::new(kernel.view(), &live, Some(r)))
                .or_else(|| Compiled::new(kernel.view(), &live, None));
            // The cost model prices kernels by `compiles`: it must not miss one.
            debug_assert!(kernel.compiled.is_none() || compiles(p, preset, members));
        }
        kernel
    }

    /// Sets the first `values.len()` positions of preset stage `i`'s register, rounding
    /// them to the stage's dtype.
    pub fn set(&mut self, i: usize, values: &[f64]) {
        let n = values.len();
        let d = self.stages[i].dtype;
        if self.narrow[i] {
            let reg = &mut self.r32[i][..n];
            if d == DType::F32 {
                reg.iter_mut().zip(values).for_each(|(r, x)| *r = *x as f32);
            } else {
                let wide = &mut self.out64[..n];
                wide.copy_from_slice(values);
                d.round_slice(wide);
                reg.iter_mut().zip(&*wide).for_each(|(r, x)| *r = *x as f32);
            }
        } else {
            let reg = &mut self.r64[i][..n];
            reg.copy_from_slice(values);
            round(d, reg);
        }
    }

    /// The first `n` positions of preset stage `i`'s register, where the stage is an f32
    /// one (its register holds f32 values): a reduction can write its rounded results
    /// there directly instead of through [`Kernel::set`].
    pub fn f32_register(&mut self, i: usize, n: usize) -> Option<&mut [f32]> {
        let r = self.reg[i];
        (self.narrow[i] && self.stages[i].dtype == DType::F32).then(|| &mut self.r32[r][..n])
    }

    /// Whether the compiled code computes the first preset stage itself (see
    /// [`Kernel::reducing`]): the caller then neither fills nor sets its register.
    pub fn reduces(&self) -> bool {
        #[cfg(feature = "jit")]
        return self.compiled.as_ref().is_some_and(|c| c.reduces);
        #[cfg(not(feature = "jit"))]
        false
    }

    /// The first `n` positions of stage `i`'s register, as f64 (exact: registers hold
    /// values of the stage's dtype).
    pub fn load_f64(&self, i: usize, n: usize, out: &mut [f64]) {
        let r = self.reg[i];
        self.check_kept(r);
        if self.narrow[i] {
            out.iter_mut()
                .zip(&self.r32[r][..n])
                .for_each(|(o, &x)| *o = x as f64);
        } else {
            out.copy_from_slice(&self.r64[r][..n]);
        }
    }

    /// The first `n` positions of stage `i`'s register where it holds f32 values (a
    /// narrow one), read in place.
    pub fn f32_values(&self, i: usize, n: usize) -> Option<&[f32]> {
        let r = self.reg[i];
        self.check_kept(r);
        self.narrow[i].then(|| &self.r32[r][..n])
    }

    /// Stores the first `n` positions of stage `i`'s register into `raw` at `at`.
    #[inline]
    pub fn store(&self, i: usize, n: usize, raw: &Raw, at: usize) {
        let r = self.reg[i];
        self.check_kept(r);
        if self.narrow[i] {
            raw.store_f32(at, &self.r32[r][..n]);
        } else {
            raw.store(at, &self.r64[r][..n]);
        }
    }

    /// [`Kernel::store`] for a peer's memory, with non-temporal stores where possible
    /// (see [`Raw::store_f32_streaming`]; the caller fences).
    #[inline]
    pub fn send(&self, i: usize, n: usize, raw: &Raw, at: usize) {
        let r = self.reg[i];
        self.check_kept(r);
        if self.narrow[i] {
            raw.store_f32_streaming(at, &self.r32[r][..n]);
        } else {
            raw.store(at, &self.r64[r][..n]);
        }
    }

    /// Register `r` holds the chunk's values: compiled code keeps only the registers read
    /// outside the kernel (see [`read_outside`]).
    #[inline]
    fn check_kept(&self, r: usize) {
        #[cfg(feature = "jit")]
        if let Some(c) = &self.compiled {
            assert!(
                (r < self.preset && !c.reduces) || c.kept[r],
                "stage {r}'s register is not kept by the compiled kernel"
            );
        }
        let _ = r;
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
        #[cfg(feature = "jit")]
        if let Some(c) = self.compiled.take() {
            c.chunk(&mut self.r32, start, n);
            // The stored stages the code did not store itself, from their registers.
            for i in self.preset..self.stages.len() {
                if let (false, Some(Mapping::Contiguous { raw, base })) =
                    (c.stores(i), &self.stages[i].store)
                {
                    self.store(i, n, raw, base + start);
                }
            }
            self.compiled = Some(c);
            return;
        }
        for i in self.preset..self.stages.len() {
            if self.reg[i] != i {
                // Its values are in an earlier stage's register already.
            } else if self.in_f32[i] {
                self.stage_f32(i, start, n);
            } else {
                self.stage_f64(i, start, n);
            }
            if let Some(Mapping::Contiguous { raw, base }) = &self.stages[i].store {
                self.store(i, n, raw, base + start);
            }
        }
    }

    /// Stage `i` on f32 lanes (every operand is narrow, the operation exactly rounded).
    /// Constants are used as scalars and plain f32 memory in place, without copies.
    fn stage_f32(&mut self, i: usize, start: usize, n: usize) {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { self.stage_f32_avx2(i, start, n) };
        }
        self.stage_f32_body(i, start, n);
    }

    /// [`Kernel::stage_f32`] compiled for AVX2 (8 lanes instead of SSE's 4). The
    /// operations are the same IEEE operations, so the results are the same bits.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn stage_f32_avx2(&mut self, i: usize, start: usize, n: usize) {
        self.stage_f32_body(i, start, n);
    }

    #[inline(always)]
    fn stage_f32_body(&mut self, i: usize, start: usize, n: usize) {
        let stage = &self.stages[i];
        for (k, s) in stage.srcs.iter().enumerate() {
            match s {
                Src::Mem(Mapping::Splat(_)) => {}
                Src::Mem(Mapping::Contiguous { raw, base })
                    if raw.f32_slice(base + start, n).is_some() => {}
                Src::Mem(m) => m.load_f32(start, &mut self.t32[k][..n]),
                Src::Reg(_) => {}
            }
        }
        let (done, rest) = self.r32.split_at_mut(i);
        let out = &mut rest[0][..n];
        let t32 = &self.t32;
        let arg = |k: usize| -> In<'_> {
            match &stage.srcs[k] {
                Src::Reg(j) => In::Lanes(&done[*j][..n]),
                Src::Mem(Mapping::Splat(x)) => In::Splat(*x as f32),
                Src::Mem(Mapping::Contiguous { raw, base }) => match raw.f32_slice(base + start, n)
                {
                    Some(s) => In::Lanes(s),
                    None => In::Lanes(&t32[k][..n]),
                },
                Src::Mem(_) => In::Lanes(&t32[k][..n]),
            }
        };
        compute_f32(&stage.op, &arg, out);
        stage.dtype.round_f32_slice(out);
    }

    /// Stage `i` in f64, rounded to its dtype (narrow registers converted on the way).
    fn stage_f64(&mut self, i: usize, start: usize, n: usize) {
        let stage = &self.stages[i];
        for (k, s) in stage.srcs.iter().enumerate() {
            match s {
                Src::Mem(m) => m.load(start, &mut self.t64[k][..n]),
                Src::Reg(j) if self.narrow[*j] => self.t64[k][..n]
                    .iter_mut()
                    .zip(&self.r32[*j][..n])
                    .for_each(|(t, x)| *t = *x as f64),
                Src::Reg(_) => {}
            }
        }
        let (done, rest) = self.r64.split_at_mut(i);
        let out = if self.narrow[i] {
            &mut self.out64[..n]
        } else {
            &mut rest[0][..n]
        };
        let (t64, narrow) = (&self.t64, &self.narrow);
        let arg = |k: usize| -> &[f64] {
            match &stage.srcs[k] {
                Src::Reg(j) if !narrow[*j] => &done[*j][..n],
                _ => &t64[k][..n],
            }
        };
        compute(stage, start, &self.shape, &arg, out);
        round(stage.dtype, out);
        if self.narrow[i] {
            self.r32[i][..n]
                .iter_mut()
                .zip(&*out)
                .for_each(|(r, x)| *r = *x as f32);
        }
    }
}

/// An f32 operand: lanes, or one value for all of them.
#[derive(Clone, Copy)]
enum In<'a> {
    Lanes(&'a [f32]),
    Splat(f32),
}

impl In<'_> {
    /// The operand as lanes, materialised into `tmp` if it is a scalar.
    fn lanes<'t>(self, tmp: &'t mut Vec<f32>, n: usize) -> &'t [f32]
    where
        Self: 't,
    {
        match self {
            In::Lanes(a) => a,
            In::Splat(x) => {
                tmp.clear();
                tmp.resize(n, x);
                tmp
            }
        }
    }
}

/// `out[i] = f(a[i])`.
#[inline(always)]
fn map1(out: &mut [f32], a: In<'_>, f: impl Fn(f32) -> f32) {
    match a {
        In::Lanes(a) => out.iter_mut().zip(a).for_each(|(o, a)| *o = f(*a)),
        In::Splat(x) => out.fill(f(x)),
    }
}

/// `out[i] = f(a[i], b[i])`, with scalars kept in registers.
#[inline(always)]
fn map2(out: &mut [f32], a: In<'_>, b: In<'_>, f: impl Fn(f32, f32) -> f32) {
    match (a, b) {
        (In::Lanes(a), In::Lanes(b)) => out
            .iter_mut()
            .zip(a.iter().zip(b))
            .for_each(|(o, (a, b))| *o = f(*a, *b)),
        (In::Lanes(a), In::Splat(y)) => out.iter_mut().zip(a).for_each(|(o, a)| *o = f(*a, y)),
        (In::Splat(x), In::Lanes(b)) => out.iter_mut().zip(b).for_each(|(o, b)| *o = f(x, *b)),
        (In::Splat(x), In::Splat(y)) => out.fill(f(x, y)),
    }
}

/// An exactly rounded operation on f32 lanes.
#[inline(always)]
fn compute_f32<'a>(op: &Op, arg: &dyn Fn(usize) -> In<'a>, out: &mut [f32]) {
    let n = out.len();
    match *op {
        Op::Unary(UnaryOp::Neg, _) => map1(out, arg(0), |a| -a),
        Op::Unary(UnaryOp::Abs, _) => map1(out, arg(0), f32::abs),
        Op::Unary(UnaryOp::Sqrt, _) => map1(out, arg(0), f32::sqrt),
        Op::Unary(UnaryOp::Relu, _) => map1(out, arg(0), |a| a.max(0.0)),
        Op::Binary(BinaryOp::Add, ..) => map2(out, arg(0), arg(1), |a, b| a + b),
        Op::Binary(BinaryOp::Sub, ..) => map2(out, arg(0), arg(1), |a, b| a - b),
        Op::Binary(BinaryOp::Mul, ..) => map2(out, arg(0), arg(1), |a, b| a * b),
        Op::Binary(BinaryOp::Div, ..) => map2(out, arg(0), arg(1), |a, b| a / b),
        Op::Binary(BinaryOp::Min, ..) => map2(out, arg(0), arg(1), |a, b| {
            coconet_core::numerics::min_exact(f64::from(a), f64::from(b)) as f32
        }),
        Op::Binary(BinaryOp::Max, ..) => map2(out, arg(0), arg(1), |a, b| {
            coconet_core::numerics::max_exact(f64::from(a), f64::from(b)) as f32
        }),
        Op::Select(..) => {
            let (mut t0, mut t1, mut t2) = (Vec::new(), Vec::new(), Vec::new());
            let (c, a, b) = (
                arg(0).lanes(&mut t0, n),
                arg(1).lanes(&mut t1, n),
                arg(2).lanes(&mut t2, n),
            );
            for i in 0..n {
                out[i] = if c[i] != 0.0 { a[i] } else { b[i] };
            }
        }
        Op::Cast(_) => map1(out, arg(0), |a| a),
        Op::Update { .. } => map1(out, arg(1), |a| a),
        ref op => unreachable!("{} is not computed in f32", op.name()),
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
            let index = LogicalIndex::new(shape, full, dim, origin);
            dropout(seed, (threshold, scale), &index, start, x, out);
        }
        ref op => unreachable!("{} is not a kernel stage", op.name()),
    }
}

/// Dropout of positions `start..start + out.len()` (operand `x`): kept elements scaled,
/// the others zero, drawn eight elements at a time ([`draw_x8`]).
fn dropout(
    seed: u64,
    (threshold, scale): (u64, f64),
    index: &LogicalIndex,
    start: usize,
    x: &[f64],
    out: &mut [f64],
) {
    let keep = |bits: u32, x: f64| {
        if bits as u64 >= threshold {
            x * scale
        } else {
            0.0
        }
    };
    let lanes = out.len() / 8 * 8;
    let (whole, tail) = out.split_at_mut(lanes);
    for (k, o) in whole.chunks_exact_mut(8).enumerate() {
        let bits = draw_x8(seed, index.eight(start + 8 * k));
        for l in 0..8 {
            o[l] = keep(bits[l], x[8 * k + l]);
        }
    }
    for (j, o) in tail.iter_mut().enumerate() {
        let g = index.of(start + lanes + j);
        *o = keep(dropout_bits(seed, g as u64), x[lanes + j]);
    }
}

/// [`dropout_bits_x8`], compiled for AVX2 where the CPU has it (four 64-bit products
/// per instruction instead of two).
fn draw_x8(seed: u64, index: [u64; 8]) -> [u32; 8] {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        #[target_feature(enable = "avx2")]
        unsafe fn avx2(seed: u64, index: [u64; 8]) -> [u32; 8] {
            dropout_bits_x8(seed, index)
        }
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { avx2(seed, index) };
    }
    dropout_bits_x8(seed, index)
}

/// The logical index of a local position of a value whose local block (shape `local`)
/// starts at `origin` along `dim` of the logical shape `full` (the two shapes differ at
/// most along `dim`): `(outer · full[dim] + origin + idx) · inner + rest`, where `idx`
/// is the position's index along `dim`. Worked out once per chunk of a stage, not per
/// element.
struct LogicalIndex {
    /// Elements per index along `dim` (the product of the dims after it).
    inner: usize,
    /// The local and logical extents along `dim`.
    local: usize,
    full: usize,
    origin: usize,
}

impl LogicalIndex {
    fn new(local: &[usize], full: &[usize], dim: usize, origin: usize) -> LogicalIndex {
        debug_assert!(
            local.len() == full.len() && (0..local.len()).all(|k| k == dim || local[k] == full[k]),
            "a local block differs from its logical shape only along the sliced dim"
        );
        let at = |s: &[usize]| s.get(dim).copied().unwrap_or(1).max(1);
        LogicalIndex {
            inner: local.iter().skip(dim + 1).product::<usize>().max(1),
            local: at(local),
            full: at(full),
            origin,
        }
    }

    /// The logical indices of positions `i..i + 8`: consecutive unless they cross the
    /// end of my block along `dim` (every `local · inner` positions).
    #[inline(always)]
    fn eight(&self, i: usize) -> [u64; 8] {
        let first = self.of(i) as u64;
        let run = self.local * self.inner;
        if run - i % run >= 8 || (self.origin == 0 && self.local == self.full) {
            std::array::from_fn(|l| first + l as u64)
        } else {
            std::array::from_fn(|l| self.of(i + l) as u64)
        }
    }

    #[inline(always)]
    fn of(&self, i: usize) -> usize {
        if self.origin == 0 && self.local == self.full {
            return i;
        }
        let (q, rest) = (i / self.inner, i % self.inner);
        let (outer, idx) = (q / self.local, q % self.local);
        (outer * self.full + self.origin + idx) * self.inner + rest
    }
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
        BinaryOp::Min => zip.for_each(|((x, y), o)| *o = coconet_core::numerics::min_exact(*x, *y)),
        BinaryOp::Max => zip.for_each(|((x, y), o)| *o = coconet_core::numerics::max_exact(*x, *y)),
        op => zip.for_each(|((x, y), o)| *o = op.eval(*x, *y, int)),
    }
}

/// Rounds a chunk to a dtype (f64: nothing; f32: one conversion per element).
pub fn round(dtype: DType, out: &mut [f64]) {
    dtype.round_slice(out);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bit patterns that exercise rounding: random floats of every magnitude (subnormals,
    /// huge, near 1), signed zeros, infinities and NaN.
    fn samples() -> Vec<f32> {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut v: Vec<f32> = (0..20_000).map(|_| f32::from_bits(next() as u32)).collect();
        v.extend((0..20_000).map(|_| 1.0 + (next() % 1_000_000) as f32 * 1e-6));
        v.extend([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MIN_POSITIVE,
        ]);
        v
    }

    /// The f32 path computes exactly what the f64 path rounds to, for every operation it
    /// takes and every narrow dtype: the premise of `Kernel`'s f32 registers.
    #[test]
    fn f32_lanes_round_like_the_interpreter() {
        let a = samples();
        let mut b = a.clone();
        b.rotate_left(7);
        let c: Vec<f32> = (0..a.len()).map(|i| (i % 3 == 0) as u8 as f32).collect();
        let x = ValueId(0);
        let ops = [
            Op::Unary(UnaryOp::Neg, x),
            Op::Unary(UnaryOp::Abs, x),
            Op::Unary(UnaryOp::Sqrt, x),
            Op::Unary(UnaryOp::Relu, x),
            Op::Binary(BinaryOp::Add, x, x),
            Op::Binary(BinaryOp::Sub, x, x),
            Op::Binary(BinaryOp::Mul, x, x),
            Op::Binary(BinaryOp::Div, x, x),
            Op::Binary(BinaryOp::Min, x, x),
            Op::Binary(BinaryOp::Max, x, x),
            Op::Select(x, x, x),
        ];
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            // Operands are values of the dtype.
            let r = |v: &[f32]| -> Vec<f32> {
                v.iter().map(|&x| dtype.round(x as f64) as f32).collect()
            };
            let (a, b) = (r(&a), r(&b));
            for op in &ops {
                let args: Vec<&[f32]> = match op {
                    Op::Select(..) => vec![&c, &a, &b],
                    _ => vec![&a, &b],
                };
                let mut narrow = vec![0.0f32; a.len()];
                compute_f32(op, &|k| In::Lanes(args[k]), &mut narrow);
                // Scalar operands (constants) give what their broadcast lanes give.
                for k in 0..args.len() {
                    let x = args[k][1];
                    let filled: Vec<f32> = vec![x; a.len()];
                    let mut with_lanes = vec![0.0f32; a.len()];
                    let mut with_splat = vec![0.0f32; a.len()];
                    let lanes = |j: usize| In::Lanes(if j == k { &filled } else { args[j] });
                    let splat = |j: usize| {
                        if j == k {
                            In::Splat(x)
                        } else {
                            In::Lanes(args[j])
                        }
                    };
                    compute_f32(op, &lanes, &mut with_lanes);
                    compute_f32(op, &splat, &mut with_splat);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&with_lanes),
                        bits(&with_splat),
                        "{}: splat {k}",
                        op.name()
                    );
                }
                narrow
                    .iter_mut()
                    .for_each(|x| *x = dtype.round(*x as f64) as f32);
                let wide_args: Vec<Vec<f64>> = args
                    .iter()
                    .map(|v| v.iter().map(|&x| x as f64).collect())
                    .collect();
                let stage = Stage {
                    id: x,
                    op: op.clone(),
                    dtype,
                    srcs: vec![],
                    store: None,
                    logical: None,
                };
                let mut wide = vec![0.0f64; a.len()];
                compute(&stage, 0, &[a.len()], &|k| &wide_args[k], &mut wide);
                round(dtype, &mut wide);
                for i in 0..a.len() {
                    let (n, w) = (narrow[i], wide[i] as f32);
                    assert!(
                        n.to_bits() == w.to_bits() || (n.is_nan() && w.is_nan()),
                        "{dtype:?} {}: {} {} -> f32 path {n:e}, f64 path {w:e}",
                        op.name(),
                        a[i],
                        b[i]
                    );
                }
            }
        }
    }
}
