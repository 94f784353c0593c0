//! Generating one kernel: a list of pointwise stages (optionally preceded by a reduction
//! from every peer's memory, and followed by writes into every peer's memory) over an
//! iteration space, for one rank.
//!
//! Semantics follow the CPU kernels (and so the reference interpreter): every stage is
//! rounded to its dtype. Registers of f16/bf16/f32 stages are `float`, of every other
//! dtype `double`. A float stage whose operation is exactly rounded (`+ - * /`, sqrt,
//! min, max, negation, select, cast) computes in float: rounding the float result to
//! f16/bf16 equals rounding the exact result, since float keeps more than twice their
//! bits plus two. Other stages compute in double and round, as the interpreter does.
//!
//! Kernels use grid-stride loops with 64-bit indices. Elementwise kernels with only
//! contiguous memory operands take four positions per thread with vector loads and
//! stores (`float4`, `double2`, four halves as `uint2`) of every aligned pointer;
//! kernels with a layer norm stage take one block per row (passes recompute the row's
//! inputs for its mean and variance, summed in the interpreter's lane order).

use super::args::{Arg, Mode, PtrArg, PtrUse};
use coconet_core::numerics::tensor::numel;
use coconet_core::numerics::{REDUCE_BLOCK, REDUCE_LANES, ROW_LANES};
use coconet_core::{
    BinaryOp, DType, Layout, Op, ReduceKind, ReduceOp, UnaryOp, ValueId, block_range,
};
use coconet_plan::plan::{Access, Plan};
use std::fmt::Write;

/// The C type a dtype is stored as.
pub fn mem_type(d: DType) -> &'static str {
    match d {
        DType::F16 => "cc_half",
        DType::BF16 => "cc_bhalf",
        DType::F32 => "float",
        DType::F64 => "double",
        DType::I32 => "int",
        DType::I64 => "cc_i64",
        DType::Bool => "unsigned char",
    }
}

/// Whether a dtype's registers are `float`.
fn is_float_reg(d: DType) -> bool {
    matches!(d, DType::F16 | DType::BF16 | DType::F32)
}

/// The register type of a dtype.
fn reg_type(d: DType) -> &'static str {
    if is_float_reg(d) { "float" } else { "double" }
}

/// Bytes of one value in its register type.
fn reg_bytes(d: DType) -> usize {
    if is_float_reg(d) { 4 } else { 8 }
}

/// Shared memory a row block may give its layer norms' cached input rows: under the 48 KiB
/// a block may declare statically, beside the reduction's `sh` (2 KiB), and small enough
/// that several blocks share an SM (4096 f32 columns take 16 KiB).
const ROW_CACHE_BYTES: usize = 40 * 1024;

/// A layer norm (stage `norm`) whose input register `x` a row block keeps in shared
/// memory, `row<norm>[column]`.
#[derive(Clone, Copy)]
struct RowCache {
    norm: usize,
    x: usize,
}

/// A stored element converted to its register type.
pub(crate) fn from_mem(d: DType, e: &str) -> String {
    match d {
        DType::F16 => format!("cc_half_to_float({e})"),
        DType::BF16 => format!("cc_bhalf_to_float({e})"),
        DType::F32 | DType::F64 => e.to_string(),
        _ => format!("(double)({e})"),
    }
}

/// A register (already rounded to `d`) converted for storing.
fn to_mem(d: DType, e: &str) -> String {
    match d {
        DType::F16 => format!("cc_float_to_half({e})"),
        DType::BF16 => format!("cc_float_to_bhalf({e})"),
        DType::F32 | DType::F64 => e.to_string(),
        DType::I32 => format!("(int)({e})"),
        DType::I64 => format!("(cc_i64)({e})"),
        DType::Bool => format!("(unsigned char)({e})"),
    }
}

/// A double expression rounded to `d` and converted for storing.
pub(crate) fn store_rounded(d: DType, e: &str) -> String {
    let r = round(d, e, false);
    to_mem(d, &r)
}

/// The reduction of `values` (double expressions, in rank order) by `op`, in double:
/// combined left to right and, for `Avg`, divided by their number — the CPU backend's
/// order, so results agree bit for bit.
pub(crate) fn reduce_expr(op: ReduceOp, values: &[String]) -> String {
    let mut e = values[0].clone();
    for x in &values[1..] {
        e = match op {
            ReduceOp::Sum | ReduceOp::Avg => format!("{e} + {x}"),
            ReduceOp::Prod => format!("({e}) * {x}"),
            ReduceOp::Max => format!("cc_max({e}, {x})"),
            ReduceOp::Min => format!("cc_min({e}, {x})"),
        };
    }
    if op == ReduceOp::Avg {
        e = format!("({e}) / {}", lit(values.len() as f64));
    }
    e
}

/// An expression computed in `float` (`in_float`) or `double`, rounded to `d` and given
/// `d`'s register type.
fn round(d: DType, e: &str, in_float: bool) -> String {
    match (d, in_float) {
        (DType::F32, true) | (DType::F64, _) => e.to_string(),
        (DType::F32, false) => format!("(float)({e})"),
        (DType::F16, true) => format!("cc_round_f16({e})"),
        (DType::F16, false) => format!("cc_round_f16d({e})"),
        (DType::BF16, true) => format!("cc_round_bf16({e})"),
        (DType::BF16, false) => format!("cc_round_bf16d({e})"),
        (DType::I32, _) => format!("cc_round_i32({e})"),
        (DType::I64, _) => format!("cc_round_i64({e})"),
        (DType::Bool, _) => format!("cc_round_bool({e})"),
    }
}

/// A C double literal that parses back to exactly `x`.
pub fn lit(x: f64) -> String {
    if x.is_nan() {
        "(0.0 / 0.0)".into()
    } else if x.is_infinite() {
        if x > 0.0 {
            "(1.0 / 0.0)"
        } else {
            "(-1.0 / 0.0)"
        }
        .into()
    } else {
        let s = format!("{x:?}");
        if s.contains(['.', 'e']) {
            s
        } else {
            format!("{s}.0")
        }
    }
}

/// Where a kernel reads the reduced operand of a fused all-reduce from.
#[derive(Debug, Clone)]
pub struct Reduction {
    /// The reduce-scatter node (the kernel's first register).
    pub rs: ValueId,
    /// Its operation.
    pub op: ReduceOp,
    /// The operand's buffer on every rank of the group, at my block's offset.
    pub sources: Vec<PtrArg>,
    /// The operand's dtype.
    pub dtype: DType,
}

/// Writes of a register into every peer's buffer (the all-gathers of a fused all-reduce).
#[derive(Debug, Clone)]
pub struct Scatter {
    /// The gathered stage.
    pub value: ValueId,
    /// Destinations, at my block's offset.
    pub dests: Vec<PtrArg>,
}

/// Accumulates a kernel's parameters and their launch arguments.
struct Params {
    decl: Vec<String>,
    args: Vec<Arg>,
}

impl Params {
    fn push(&mut self, decl: String, arg: Arg) -> String {
        let name = format!("a{}", self.args.len());
        self.decl.push(decl.replace("{}", &name));
        self.args.push(arg);
        name
    }
}

/// A memory operand of a stage, resolved for this rank.
struct MemSrc {
    ptr: String,
    dtype: DType,
    access: Access,
    /// Parameter names of a strided access's dims and strides, or of a cyclic period.
    extra: Vec<String>,
}

impl MemSrc {
    /// The element at position `i` (or `base + i` for a contiguous source whose pointer
    /// already points at position 0).
    fn at(&self, i: &str) -> String {
        let e = match &self.access {
            Access::Splat { .. } => format!("{}[0]", self.ptr),
            Access::Contiguous { .. } => format!("{}[{i}]", self.ptr),
            Access::Cyclic { .. } => format!("{}[{i} % {}]", self.ptr, self.extra[0]),
            Access::Strided { shape, .. } => {
                let r = shape.len();
                let mut off = String::from("0");
                for k in 0..r {
                    let (d, s) = (&self.extra[k], &self.extra[r + k]);
                    let inner: Vec<&String> = self.extra[k + 1..r].iter().collect();
                    let div = if inner.is_empty() {
                        String::new()
                    } else {
                        format!(
                            " / ({})",
                            inner
                                .iter()
                                .map(|x| x.as_str())
                                .collect::<Vec<_>>()
                                .join(" * ")
                        )
                    };
                    off = format!("{off} + (({i}{div}) % {d}) * {s}");
                }
                format!("{}[{off}]", self.ptr)
            }
        };
        from_mem(self.dtype, &e)
    }
}

/// How a stage's operand is read.
enum Operand {
    Reg(usize),
    Uniform(String),
    Mem(usize),
}

/// One stage, ready to emit.
struct Stage {
    id: ValueId,
    op: Op,
    dtype: DType,
    operands: Vec<(Operand, DType)>,
    store: Option<String>,
    /// Dropout: parameter names of (inner, local extent, logical extent, origin) along
    /// the sliced dim.
    logical: Vec<String>,
}

/// A kernel being generated for one rank.
pub struct KernelGen<'a> {
    plan: &'a Plan,
    rank: usize,
    shape: Vec<usize>,
    params: Params,
    mems: Vec<MemSrc>,
    stages: Vec<Stage>,
    reduction: Option<(Reduction, String)>,
    /// (stage, dtype, pointer-array parameter, destinations).
    scatters: Vec<(usize, DType, String, usize)>,
    /// (stage, f64 pointer parameter): stages also written as f64 into scratch.
    spills: Vec<(usize, String)>,
    /// Full reductions of stages folded per reference block (see [`Self::fold`]).
    folds: Vec<Fold>,
    rows: bool,
}

/// A full reduction of stage `stage` whose first level the kernel computes: one value
/// per [`REDUCE_BLOCK`] positions, written at `ptr[block]`.
struct Fold {
    stage: usize,
    kind: ReduceKind,
    ptr: String,
}

/// How a full reduction of `kind` folds in the reference order, as C expressions: the
/// identity, the value `x` mapped (squared for a norm), the combination of `a` and `b`,
/// and the result from the total `s`.
pub(crate) fn reduce_terms(kind: ReduceKind) -> [&'static str; 4] {
    match kind {
        ReduceKind::Sum => ["-0.0", "x", "a + b", "s"],
        ReduceKind::Norm2 => ["-0.0", "x * x", "a + b", "sqrt(s)"],
        ReduceKind::Max => ["-1.0 / 0.0", "x", "cc_max(a, b)", "s"],
        ReduceKind::Min => ["1.0 / 0.0", "x", "cc_min(a, b)", "s"],
    }
}

/// Opens lane `t`'s loop over its values of reference block `blk` (positions t, t + 256,
/// ... of the block, in order: the reference lane order, coalesced), defining position
/// `i`; the caller closes it.
pub(crate) fn lane_values(b: &mut String, indent: &str) {
    let _ = writeln!(
        b,
        "{indent}for (int j = 0; j < {}; j++) {{",
        REDUCE_BLOCK / REDUCE_LANES
    );
    let _ = writeln!(
        b,
        "{indent}  const cc_i64 i = blk * {REDUCE_BLOCK}ll + j * {REDUCE_LANES} + t;"
    );
}

/// The statement folding `value` into lane accumulator `acc` as the reference does
/// (`map` of `x`, then `comb` of `a` and `b`).
pub(crate) fn fold_step(acc: &str, value: &str, map: &str, comb: &str) -> String {
    format!("{{ const double x = {value}; const double a = {acc}, b = {map}; {acc} = {comb}; }}")
}

/// A generated kernel body and its launch arguments (the name is chosen later, when
/// identical kernels are merged).
pub struct Generated {
    /// `CC_KERNEL NAME(params) { .. }` with `NAME` to be replaced.
    pub source: String,
    /// Arguments, in parameter order.
    pub args: Vec<Arg>,
    /// Positions of the iteration space.
    pub len: usize,
    /// How positions map to threads.
    pub mode: Mode,
}

impl<'a> KernelGen<'a> {
    /// A kernel over `members` on `rank`, iteration space `shape` (the local shape of the
    /// first member, or of the reduce-scatter of a fused all-reduce).
    pub fn new(
        plan: &'a Plan,
        rank: usize,
        shape: Vec<usize>,
        reduction: Option<Reduction>,
        members: &[ValueId],
    ) -> Result<KernelGen<'a>, String> {
        let mut g = KernelGen {
            plan,
            rank,
            shape,
            params: Params {
                decl: vec!["cc_i64 lo, cc_i64 hi".into()],
                args: vec![Arg::Range],
            },
            mems: vec![],
            stages: vec![],
            reduction: None,
            scatters: vec![],
            spills: vec![],
            folds: vec![],
            rows: false,
        };
        if let Some(r) = reduction {
            let ptrs = g.params.push(
                format!("{} const* const* __restrict__ {{}}", mem_type(r.dtype)),
                Arg::Reads(r.sources.clone()),
            );
            g.stages.push(Stage {
                id: r.rs,
                op: plan.program().node(r.rs).op.clone(),
                dtype: plan.program().node(r.rs).ty.dtype,
                operands: vec![],
                store: None,
                logical: vec![],
            });
            let store = g.store_of(r.rs);
            g.stages[0].store = store;
            g.reduction = Some((r, ptrs));
        }
        for &m in members {
            g.stage(m)?;
        }
        Ok(g)
    }

    fn store_of(&mut self, m: ValueId) -> Option<String> {
        let b = self.plan.buffer(m)?;
        let d = self.plan.program().node(m).ty.dtype;
        Some(self.params.push(
            format!("{}* __restrict__ {{}}", mem_type(d)),
            Arg::Ptr(
                PtrArg {
                    rank: self.rank,
                    buffer: b,
                    offset: 0,
                },
                PtrUse::WritesAt,
            ),
        ))
    }

    fn stage(&mut self, m: ValueId) -> Result<(), String> {
        let p = self.plan.program();
        let node = p.node(m);
        let mut operands = vec![];
        for o in node.op.operands() {
            let d = p.node(o).ty.dtype;
            if let Some(i) = self.stages.iter().position(|s| s.id == o) {
                operands.push((Operand::Reg(i), d));
            } else if self.plan.storage(o) == Some(coconet_plan::plan::Storage::Uniform) {
                let name = self.params.push("double {}".into(), Arg::Uniform(o));
                operands.push((Operand::Uniform(name), d));
            } else {
                let view = self.plan.operand_view(m, o, self.rank).ok_or_else(|| {
                    format!(
                        "operand `{}` of `{}` has no storage",
                        p.label(o),
                        p.label(m)
                    )
                })?;
                let access = view.access(&self.shape);
                let base = match &access {
                    Access::Splat { base }
                    | Access::Contiguous { base }
                    | Access::Cyclic { base, .. }
                    | Access::Strided { base, .. } => *base,
                };
                let ptr = self.params.push(
                    format!("{} const* __restrict__ {{}}", mem_type(d)),
                    Arg::Ptr(
                        PtrArg {
                            rank: self.rank,
                            buffer: view.buffer,
                            offset: base,
                        },
                        footprint(&access),
                    ),
                );
                let mut extra = vec![];
                match &access {
                    Access::Cyclic { period, .. } => extra.push(
                        self.params
                            .push("cc_i64 {}".into(), Arg::I64(*period as i64)),
                    ),
                    Access::Strided { shape, strides, .. } => {
                        for &x in shape.iter().chain(strides) {
                            extra.push(self.params.push("cc_i64 {}".into(), Arg::I64(x as i64)));
                        }
                    }
                    _ => {}
                }
                self.mems.push(MemSrc {
                    ptr,
                    dtype: d,
                    access,
                    extra,
                });
                operands.push((Operand::Mem(self.mems.len() - 1), d));
            }
        }
        let mut logical = vec![];
        if let Op::Dropout { .. } = node.op {
            let full = self.plan.shape(m).to_vec();
            let q = self.plan.group_size();
            let (origin, dim) = match node.ty.layout {
                Layout::Sliced(d) => (block_range(full[d], q, self.rank % q).start, d),
                _ => (0, 0),
            };
            let local = self.plan.local_shape(m, self.rank);
            let vals = [
                numel(full.get(dim + 1..).unwrap_or(&[])).max(1),
                local.get(dim).copied().unwrap_or(1).max(1),
                full.get(dim).copied().unwrap_or(1).max(1),
                origin,
            ];
            for v in vals {
                logical.push(self.params.push("cc_i64 {}".into(), Arg::I64(v as i64)));
            }
        }
        if let Op::LayerNorm { x, .. } = node.op {
            self.rows = true;
            // Layer norm reads its input from a register: copy a memory input into one.
            if let (Operand::Mem(_) | Operand::Uniform(_), d) = operands[0] {
                let (src, _) =
                    std::mem::replace(&mut operands[0], (Operand::Reg(self.stages.len()), d));
                self.stages.push(Stage {
                    id: x,
                    op: Op::Cast(x),
                    dtype: d,
                    operands: vec![(src, d)],
                    store: None,
                    logical: vec![],
                });
            }
        }
        if !coconet_plan::plan::is_kernel_op(&node.op) && !matches!(node.op, Op::LayerNorm { .. }) {
            return Err(format!(
                "`{}` ({}) is not a pointwise stage",
                p.label(m),
                node.op.name()
            ));
        }
        let store = self.store_of(m);
        self.stages.push(Stage {
            id: m,
            op: node.op.clone(),
            dtype: node.ty.dtype,
            operands,
            store,
            logical,
        });
        Ok(())
    }

    /// Adds writes of stage `value`'s register into every destination.
    pub fn scatter(&mut self, s: Scatter) -> Result<(), String> {
        let i = self
            .stages
            .iter()
            .position(|st| st.id == s.value)
            .ok_or_else(|| "gathered values are fused stages".to_string())?;
        let d = self.stages[i].dtype;
        let q = s.dests.len();
        let ptrs = self.params.push(
            format!("{}* const* __restrict__ {{}}", mem_type(d)),
            Arg::Writes(s.dests),
        );
        self.scatters.push((i, d, ptrs, q));
        Ok(())
    }

    /// Adds a write of stage `value`'s register, as f64 (exact), at `dest` (scratch):
    /// a full reduction of the stage then reads it there.
    pub fn spill(&mut self, value: ValueId, dest: Arg) -> Result<(), String> {
        let i = self
            .stages
            .iter()
            .position(|st| st.id == value)
            .ok_or_else(|| "a reduced value is a fused stage".to_string())?;
        let ptr = self.params.push("double* __restrict__ {}".into(), dest);
        self.spills.push((i, ptr));
        Ok(())
    }

    /// Whether full reductions of this kernel's stages can be folded in it ([`Self::fold`]):
    /// not in a row kernel, whose blocks are rows.
    pub fn can_fold(&self) -> bool {
        !self.rows
    }

    /// Folds the full reduction (`kind`) of stage `value` over the kernel's positions
    /// into its first reference level: a block of [`REDUCE_LANES`] threads per
    /// [`REDUCE_BLOCK`] positions, lane t folding positions t, t + 256, ... in order and
    /// the lanes combined as a shared-memory tree, the block's value written at
    /// `dest[block]` — exactly what the reduction's first level kernel computes over
    /// the same values written out, without writing them.
    pub fn fold(&mut self, value: ValueId, kind: ReduceKind, dest: Arg) -> Result<(), String> {
        let stage = self
            .stages
            .iter()
            .position(|st| st.id == value)
            .ok_or_else(|| "a reduced value is a fused stage".to_string())?;
        if !self.can_fold() {
            return Err("a row kernel cannot fold a full reduction".into());
        }
        let ptr = self.params.push("double* __restrict__ {}".into(), dest);
        self.folds.push(Fold { stage, kind, ptr });
        Ok(())
    }

    /// Whether every memory access is contiguous (the vectorised path applies).
    fn all_contiguous(&self) -> bool {
        !self.rows
            && self
                .mems
                .iter()
                .all(|m| matches!(m.access, Access::Contiguous { .. } | Access::Splat { .. }))
            && !self
                .stages
                .iter()
                .any(|s| matches!(s.op, Op::Dropout { .. }))
    }

    /// The register expression of operand `k` of stage `s` at position `i`.
    fn operand(&self, s: &Stage, k: usize, i: &str, lane: &str) -> String {
        match &s.operands[k].0 {
            Operand::Reg(j) => format!("r{j}{lane}"),
            Operand::Uniform(name) => {
                if is_float_reg(s.operands[k].1) {
                    format!("(float){name}")
                } else {
                    name.clone()
                }
            }
            Operand::Mem(m) => {
                let mem = &self.mems[*m];
                if let Access::Cyclic { period, .. } = mem.access
                    && self.rows
                    && i == "i"
                    && Some(&period) == self.shape.last()
                {
                    // Row blocks: position i = row * h + c, so a block as long as a row
                    // (a bias or gain `[H]`) is read at the column, without a 64-bit
                    // remainder per element.
                    from_mem(mem.dtype, &format!("{}[c]", mem.ptr))
                } else if lane.is_empty() {
                    self.mems[*m].at(i)
                } else if let Access::Splat { .. } = self.mems[*m].access {
                    self.mems[*m].at(i)
                } else {
                    format!("m{m}{lane}")
                }
            }
        }
    }

    /// The statement computing stage `j` at position `i` into `r{j}{lane}`.
    fn compute(&self, j: usize, i: &str, lane: &str, ln: &dyn Fn(usize) -> String) -> String {
        let s = &self.stages[j];
        let t = reg_type(s.dtype);
        if j == 0
            && let Some((r, ptrs)) = &self.reduction
        {
            let loads: Vec<String> = (0..r.sources.len())
                .map(|k| {
                    format!(
                        "(double){}",
                        from_mem(r.dtype, &format!("{ptrs}[{k}][{i}]"))
                    )
                })
                .collect();
            let e = reduce_expr(r.op, &loads);
            return format!("{t} r0{lane} = {};", round(s.dtype, &e, false));
        }
        let float = is_float_reg(s.dtype)
            && s.operands.iter().all(|(_, d)| is_float_reg(*d))
            && s.op.is_exactly_rounded();
        let ct = if float { "float" } else { "double" };
        let a = |k: usize| format!("({ct}){}", self.operand(s, k, i, lane));
        let zero = if float { "0.0f" } else { "0.0" };
        let e = match s.op {
            Op::Unary(u, _) => match u {
                UnaryOp::Neg => format!("-{}", a(0)),
                UnaryOp::Abs => format!("fabs({})", a(0)),
                UnaryOp::Sqrt => format!("sqrt({})", a(0)),
                UnaryOp::Rsqrt => format!("1.0 / sqrt({})", a(0)),
                UnaryOp::Exp => format!("cc_exp({})", a(0)),
                UnaryOp::Log => format!("cc_log({})", a(0)),
                UnaryOp::Tanh => format!("cc_tanh({})", a(0)),
                UnaryOp::Relu => format!("fmax({}, {zero})", a(0)),
                UnaryOp::Gelu => {
                    let x = a(0);
                    let c = lit((2.0 / std::f64::consts::PI).sqrt());
                    format!("0.5 * {x} * (1.0 + cc_tanh({c} * ({x} + 0.044715 * {x} * {x} * {x})))")
                }
            },
            Op::Binary(b, x, _) => {
                let (l, r) = (a(0), a(1));
                let int = self.plan.program().node(x).ty.dtype.is_int();
                match b {
                    BinaryOp::Add => format!("{l} + {r}"),
                    BinaryOp::Sub => format!("{l} - {r}"),
                    BinaryOp::Mul => format!("{l} * {r}"),
                    BinaryOp::Div if int => format!("trunc({l} / {r})"),
                    BinaryOp::Div => format!("{l} / {r}"),
                    BinaryOp::Pow => format!("cc_pow({l}, {r})"),
                    BinaryOp::Min => format!("cc_min({l}, {r})"),
                    BinaryOp::Max => format!("cc_max({l}, {r})"),
                    BinaryOp::Lt => format!("{l} < {r} ? 1.0 : 0.0"),
                    BinaryOp::Le => format!("{l} <= {r} ? 1.0 : 0.0"),
                    BinaryOp::Gt => format!("{l} > {r} ? 1.0 : 0.0"),
                    BinaryOp::Ge => format!("{l} >= {r} ? 1.0 : 0.0"),
                    BinaryOp::Eq => format!("{l} == {r} ? 1.0 : 0.0"),
                    BinaryOp::Ne => format!("{l} != {r} ? 1.0 : 0.0"),
                }
            }
            Op::Select(..) => format!(
                "(double){} != 0.0 ? {} : {}",
                self.operand(s, 0, i, lane),
                a(1),
                a(2)
            ),
            Op::Cast(_) => a(0),
            Op::Update { .. } => a(1),
            Op::Dropout { .. } => {
                let l = &s.logical;
                let g = format!(
                    "(cc_u64)((({i} / ({i0} * {i1})) * {i2} + ({i} / {i0}) % {i1} + {i3}) * {i0} + {i} % {i0})",
                    i0 = l[0],
                    i1 = l[1],
                    i2 = l[2],
                    i3 = l[3]
                );
                format!(
                    "cc_dropout_bits((cc_u64)(cc_i64){p_seed}, {g}) >= cc_dropout_threshold({p}) ? {x} * (1.0 / (1.0 - {p})) : 0.0",
                    p_seed = a(2),
                    p = a(1),
                    x = a(0)
                )
            }
            Op::LayerNorm { .. } => ln(j),
            ref op => unreachable!("{} is not a kernel stage", op.name()),
        };
        format!("{t} r{j}{lane} = {};", round(s.dtype, &e, float))
    }

    /// Statements computing stages `0..upto` at position `i` (layer norm stages use
    /// their row statistics `mean{j}`, `inv{j}`).
    fn body(&self, upto: usize, i: &str, lane: &str, out: &mut String, indent: &str) {
        for j in 0..upto {
            let _ = writeln!(out, "{indent}{}", self.stage_line(j, i, lane, &[]));
        }
    }

    /// A row block's [`Self::body`] at position `i`, column `c`: only the stages `roots`
    /// need, with the registers `cached` names (a layer norm's input kept in the block's
    /// row cache `row<j>`) read from there, so the stages only they needed (and their
    /// loads) are left out.
    fn row_body(&self, upto: usize, cached: &[RowCache], roots: &[usize], out: &mut String) {
        let live = self.live(upto, cached, roots);
        for j in (0..upto).filter(|&j| live[j]) {
            let _ = writeln!(out, "        {}", self.stage_line(j, "i", "", cached));
        }
    }

    /// The statement computing stage `j` at position `i` into `r{j}{lane}`, or reading it
    /// from its row cache.
    fn stage_line(&self, j: usize, i: &str, lane: &str, cached: &[RowCache]) -> String {
        if let Some(r) = cached.iter().find(|r| r.x == j) {
            let t = reg_type(self.stages[j].dtype);
            return format!("const {t} r{j}{lane} = row{}[c];", r.norm);
        }
        let ln = |j: usize| {
            let s = &self.stages[j];
            format!(
                "((double)r{x}{lane} - mean{j}) * inv{j} * (double){g} + (double){b}",
                x = match s.operands[0].0 {
                    Operand::Reg(x) => x,
                    _ => unreachable!("layer norm inputs are loaded into registers first"),
                },
                g = self.operand(s, 1, i, lane),
                b = self.operand(s, 2, i, lane),
            )
        };
        self.compute(j, i, lane, &ln)
    }

    /// Which of stages `0..upto` the `roots` need, through their register operands (a
    /// `cached` register needs nothing).
    fn live(&self, upto: usize, cached: &[RowCache], roots: &[usize]) -> Vec<bool> {
        let mut live = vec![false; upto];
        for &r in roots.iter().filter(|&&r| r < upto) {
            live[r] = true;
        }
        for j in (0..upto).rev() {
            if !live[j] || cached.iter().any(|c| c.x == j) {
                continue;
            }
            for (o, _) in &self.stages[j].operands {
                if let Operand::Reg(k) = o {
                    live[*k] = true;
                }
            }
        }
        live
    }

    /// The stages whose registers leave the kernel: stored, written to peers, spilled.
    fn written(&self) -> Vec<usize> {
        let stored = self
            .stages
            .iter()
            .enumerate()
            .filter(|(_, s)| s.store.is_some());
        let mut w: Vec<usize> = stored.map(|(j, _)| j).collect();
        w.extend(self.scatters.iter().map(|(j, ..)| *j));
        w.extend(self.spills.iter().map(|(j, _)| *j));
        w
    }

    fn stores(&self, i: &str, lane: &str, out: &mut String, indent: &str) {
        for (j, s) in self.stages.iter().enumerate() {
            if let Some(ptr) = &s.store {
                let _ = writeln!(
                    out,
                    "{indent}{ptr}[{i}] = {};",
                    to_mem(s.dtype, &format!("r{j}{lane}"))
                );
            }
        }
        for (j, d, ptrs, q) in &self.scatters {
            for k in 0..*q {
                let _ = writeln!(
                    out,
                    "{indent}{ptrs}[{k}][{i}] = {};",
                    to_mem(*d, &format!("r{j}{lane}"))
                );
            }
        }
        for (j, ptr) in &self.spills {
            let _ = writeln!(out, "{indent}{ptr}[{i}] = (double)r{j}{lane};");
        }
    }

    /// Emits the kernel.
    pub fn finish(self) -> Generated {
        let len = numel(&self.shape);
        let mut b = String::new();
        let _ = writeln!(b, "CC_KERNEL NAME({}) {{", self.params.decl.join(", "));
        let mode;
        if self.rows {
            let h = self.shape.last().copied().unwrap_or(1).max(1);
            mode = Mode::Rows(h);
            self.row_blocks(h, &mut b);
        } else if !self.folds.is_empty() {
            mode = Mode::Rows(REDUCE_BLOCK);
            self.fold_blocks(&mut b);
        } else if self.all_contiguous() {
            mode = Mode::Vector;
            self.vectorised(&mut b);
        } else {
            mode = Mode::Elements;
            let _ = writeln!(
                b,
                "  for (cc_i64 i = lo + cc_tid(); i < hi; i += cc_nthreads()) {{"
            );
            self.body(self.stages.len(), "i", "", &mut b, "    ");
            self.stores("i", "", &mut b, "    ");
            let _ = writeln!(b, "  }}");
        }
        let _ = writeln!(b, "}}");
        Generated {
            source: b,
            args: self.params.args,
            len,
            mode,
        }
    }

    /// One block of [`ROW_LANES`] threads per row (rows grid-strided over blocks): each
    /// layer norm's mean and variance are lane sums (thread t adds positions t, t +
    /// `ROW_LANES`, ... with coalesced loads) combined as a shared-memory tree, the order
    /// of [`coconet_core::numerics::row_sum`]. The first pass keeps the layer norm's input
    /// row in shared memory (when the rows fit, [`ROW_CACHE_BYTES`]), so the variance pass
    /// and the output pass read it there instead of recomputing the stages before it from
    /// memory: one read of the row instead of three. Rows too long for shared memory are
    /// recomputed in each pass. Per-thread values do not outlive a barrier (the emulator
    /// runs each stretch between barriers as a loop over the threads), so the row
    /// statistics live in shared memory too.
    fn row_blocks(&self, h: usize, b: &mut String) {
        let lanes = ROW_LANES;
        let _ = writeln!(b, "  const cc_i64 h = {h};");
        let _ = writeln!(b, "  CC_SHARED double sh[{lanes}];");
        let norms: Vec<usize> = (0..self.stages.len())
            .filter(|&j| matches!(self.stages[j].op, Op::LayerNorm { .. }))
            .collect();
        let input = |j: usize| match self.stages[j].operands[0].0 {
            Operand::Reg(x) => x,
            _ => unreachable!("layer norm inputs are registers"),
        };
        // Which norms keep their input row, in order, while the rows fit.
        let mut cache_bytes = 0;
        let mut cacheable = vec![];
        for &j in &norms {
            let x = input(j);
            let bytes = h * reg_bytes(self.stages[x].dtype);
            if cache_bytes + bytes <= ROW_CACHE_BYTES {
                cache_bytes += bytes;
                cacheable.push(RowCache { norm: j, x });
            }
        }
        for j in &norms {
            let _ = writeln!(b, "  CC_SHARED double mean{j}, inv{j};");
        }
        for r in &cacheable {
            let t = reg_type(self.stages[r.x].dtype);
            let _ = writeln!(b, "  CC_SHARED {t} row{}[{h}];", r.norm);
        }
        let _ = writeln!(
            b,
            "  for (cc_i64 row = lo / h + blockIdx.x; row < hi / h; row += gridDim.x) {{"
        );
        // The rows cached so far: a norm's pass reads the inputs of the norms before it.
        let mut cached: Vec<RowCache> = vec![];
        for &j in &norms {
            let x = input(j);
            let cache = cacheable.iter().find(|r| r.norm == j).copied();
            let eps = self.operand(&self.stages[j], 3, "row * h", "");
            for pass in 0..2 {
                let _ = writeln!(b, "    CC_THREADS(t)");
                let _ = writeln!(b, "      double s = -0.0;");
                let _ = writeln!(b, "      for (cc_i64 c = t; c < h; c += {lanes}) {{");
                if pass == 0 || cache.is_none() {
                    let _ = writeln!(b, "        const cc_i64 i = row * h + c;");
                    self.row_body(j, &cached, &[x], b);
                } else {
                    let t = reg_type(self.stages[x].dtype);
                    let _ = writeln!(b, "        const {t} r{x} = row{j}[c];");
                }
                if pass == 0 {
                    if cache.is_some() {
                        let _ = writeln!(b, "        row{j}[c] = r{x};");
                    }
                    let _ = writeln!(b, "        s = s + (double)r{x};");
                } else {
                    let _ = writeln!(
                        b,
                        "        const double d = (double)r{x} - mean{j}; s = s + d * d;"
                    );
                }
                let _ = writeln!(b, "      }}");
                let _ = writeln!(b, "      sh[t] = s;");
                let _ = writeln!(b, "    CC_END_THREADS");
                shared_tree(b, "sh", lanes, "a + b");
                let _ = writeln!(b, "    CC_THREADS(t)");
                if pass == 0 {
                    let _ = writeln!(b, "      if (t == 0) mean{j} = sh[0] / (double)h;");
                } else {
                    let _ = writeln!(
                        b,
                        "      if (t == 0) inv{j} = 1.0 / sqrt(sh[0] / (double)h + (double){eps});"
                    );
                }
                let _ = writeln!(b, "    CC_END_THREADS");
            }
            cached.extend(cache);
        }
        let _ = writeln!(b, "    CC_THREADS(t)");
        let _ = writeln!(b, "      for (cc_i64 c = t; c < h; c += {lanes}) {{");
        let _ = writeln!(b, "        const cc_i64 i = row * h + c;");
        let written = self.written();
        let n = self.stages.len();
        self.row_body(n, &cached, &written, b);
        self.stores("i", "", b, "        ");
        let _ = writeln!(b, "      }}");
        let _ = writeln!(b, "    CC_END_THREADS");
        let _ = writeln!(b, "  }}");
    }

    /// One block of [`REDUCE_LANES`] threads per [`REDUCE_BLOCK`] positions (the last
    /// block possibly partial): every stage and store at each position, each fold's lane
    /// value updated as the reduction's first level does over the value written out
    /// (`const double x = (double)r; a = s, b = map(x); s = comb(a, b)`), then a tree
    /// per fold (per-thread values do not outlive a barrier in the emulator, so the lane
    /// values go to shared arrays first).
    fn fold_blocks(&self, b: &mut String) {
        let (lanes, block) = (REDUCE_LANES, REDUCE_BLOCK);
        for k in 0..self.folds.len() {
            let _ = writeln!(b, "  CC_SHARED double f{k}[{lanes}];");
        }
        let _ = writeln!(
            b,
            "  for (cc_i64 blk = lo / {block} + blockIdx.x; blk * {block} < hi; blk += gridDim.x) {{"
        );
        let _ = writeln!(b, "    CC_THREADS(t)");
        for (k, f) in self.folds.iter().enumerate() {
            let _ = writeln!(b, "      double s{k} = {};", reduce_terms(f.kind)[0]);
        }
        lane_values(b, "      ");
        let _ = writeln!(b, "        if (i < hi) {{");
        self.body(self.stages.len(), "i", "", b, "          ");
        self.stores("i", "", b, "          ");
        for (k, f) in self.folds.iter().enumerate() {
            let [_, map, comb, _] = reduce_terms(f.kind);
            let step = fold_step(
                &format!("s{k}"),
                &format!("(double)r{}", f.stage),
                map,
                comb,
            );
            let _ = writeln!(b, "          {step}");
        }
        let _ = writeln!(b, "        }}");
        let _ = writeln!(b, "      }}");
        for k in 0..self.folds.len() {
            let _ = writeln!(b, "      f{k}[t] = s{k};");
        }
        let _ = writeln!(b, "    CC_END_THREADS");
        for (k, f) in self.folds.iter().enumerate() {
            shared_tree(b, &format!("f{k}"), lanes, reduce_terms(f.kind)[2]);
        }
        let _ = writeln!(b, "    CC_THREADS(t)");
        for (k, f) in self.folds.iter().enumerate() {
            let _ = writeln!(b, "      if (t == 0) {}[blk] = f{k}[0];", f.ptr);
        }
        let _ = writeln!(b, "    CC_END_THREADS");
        let _ = writeln!(b, "  }}");
    }

    /// The four-positions-per-thread loop: vector loads and stores of every aligned
    /// pointer, scalar ones of the others, scalar code for the tail. A chunk that starts
    /// off alignment (a rank's block when N/P is not a multiple of 4) peels its first
    /// positions so that at least its first pointer is aligned.
    fn vectorised(&self, b: &mut String) {
        // Pointers read or written four at a time (without their index).
        let mut ptrs: Vec<(String, DType)> = vec![];
        for m in &self.mems {
            if let Access::Contiguous { .. } = m.access {
                ptrs.push((m.ptr.clone(), m.dtype));
            }
        }
        if let Some((r, name)) = &self.reduction {
            for k in 0..r.sources.len() {
                ptrs.push((format!("{name}[{k}]"), r.dtype));
            }
        }
        for s in &self.stages {
            if let Some(p) = &s.store {
                ptrs.push((p.clone(), s.dtype));
            }
        }
        for (_, d, name, q) in &self.scatters {
            for k in 0..*q {
                ptrs.push((format!("{name}[{k}]"), *d));
            }
        }
        for (_, ptr) in &self.spills {
            ptrs.push((ptr.clone(), DType::F64));
        }
        let vectorisable = ptrs.iter().all(|(_, d)| vec_width_bytes(*d).is_some());
        let start = match ptrs.first() {
            Some((p, d)) if vectorisable => {
                let w = vec_width_bytes(*d).expect("vectorisable");
                let _ = writeln!(
                    b,
                    "  const cc_i64 a = lo + cc_peel((cc_u64)&{p}[lo], {w}, {}, hi - lo);",
                    d.size_bytes()
                );
                let _ = writeln!(
                    b,
                    "  for (cc_i64 i = lo + cc_tid(); i < a; i += cc_nthreads()) {{"
                );
                self.body(self.stages.len(), "i", "", b, "    ");
                self.stores("i", "", b, "    ");
                let _ = writeln!(b, "  }}");
                "a"
            }
            _ => "lo",
        };
        let _ = writeln!(
            b,
            "  for (cc_i64 i0 = {start} + cc_tid() * 4; i0 < hi; i0 += cc_nthreads() * 4) {{"
        );
        if vectorisable {
            let _ = writeln!(b, "    if (i0 + 4 <= hi) {{");
            // Vector loads of contiguous operands into m<k>_<lane>.
            for (k, m) in self.mems.iter().enumerate() {
                if let Access::Contiguous { .. } = m.access {
                    vec_load(b, &format!("m{k}"), &format!("{}[i0]", m.ptr), m.dtype);
                }
            }
            if let Some((r, name)) = &self.reduction {
                for k in 0..r.sources.len() {
                    vec_load(b, &format!("p{k}"), &format!("{name}[{k}][i0]"), r.dtype);
                }
            }
            for lane in 0..4 {
                let l = format!("_{lane}");
                let _ = writeln!(b, "      const cc_i64 i{l} = i0 + {lane};");
                for j in 0..self.stages.len() {
                    let stmt = if j == 0 && self.reduction.is_some() {
                        self.reduce_from_lanes(&l)
                    } else {
                        self.compute(j, &format!("i{l}"), &l, &|_| unreachable!("no rows"))
                    };
                    let _ = writeln!(b, "      {stmt}");
                }
            }
            for (j, s) in self.stages.iter().enumerate() {
                if let Some(p) = &s.store {
                    vec_store(b, &format!("{p}[i0]"), s.dtype, &format!("r{j}"));
                }
            }
            for (j, d, name, q) in &self.scatters {
                for k in 0..*q {
                    vec_store(b, &format!("{name}[{k}][i0]"), *d, &format!("r{j}"));
                }
            }
            for (j, ptr) in &self.spills {
                vec_store(b, &format!("{ptr}[i0]"), DType::F64, &format!("r{j}"));
            }
            let _ = writeln!(b, "    }} else {{");
        } else {
            let _ = writeln!(b, "    {{");
        }
        let _ = writeln!(b, "      for (cc_i64 i = i0; i < i0 + 4 && i < hi; i++) {{");
        self.body(self.stages.len(), "i", "", b, "        ");
        self.stores("i", "", b, "        ");
        let _ = writeln!(b, "      }}");
        let _ = writeln!(b, "    }}");
        let _ = writeln!(b, "  }}");
    }

    /// The reduction stage of lane `l` from vector-loaded peers `p<k>_<lane>`.
    fn reduce_from_lanes(&self, l: &str) -> String {
        let (r, _) = self.reduction.as_ref().expect("reduction");
        let s = &self.stages[0];
        let lanes: Vec<String> = (0..r.sources.len())
            .map(|k| format!("(double)p{k}{l}"))
            .collect();
        let e = reduce_expr(r.op, &lanes);
        format!(
            "{} r0{l} = {};",
            reg_type(s.dtype),
            round(s.dtype, &e, false)
        )
    }
}

/// The tree over a block's `lanes` partial results in the shared array `sh` (lane t
/// combines lane t + s for s = lanes/2, ..., 1; `comb` in terms of `a` and `b`): the
/// order of `coconet_core`'s full reductions and row sums. Leaves the result in `sh[0]`.
pub(crate) fn shared_tree(b: &mut String, sh: &str, lanes: usize, comb: &str) {
    let _ = writeln!(
        b,
        "    for (unsigned st = {}; st > 0; st >>= 1) {{",
        lanes / 2
    );
    let _ = writeln!(b, "      CC_THREADS(t)");
    let _ = writeln!(
        b,
        "        if (t < st) {{ const double a = {sh}[t], b = {sh}[t + st]; {sh}[t] = {comb}; }}"
    );
    let _ = writeln!(b, "      CC_END_THREADS");
    let _ = writeln!(b, "    }}");
}

/// Bytes of a four-element vector access, for dtypes with a vector path.
fn vec_width_bytes(d: DType) -> Option<usize> {
    match d {
        DType::F32 => Some(16),
        DType::F64 => Some(16),
        DType::F16 | DType::BF16 => Some(8),
        _ => None,
    }
}

/// Declares `name_0..name_3` (registers) from four elements at `at`: one vector load
/// where `at` is aligned, else four scalar loads. Every pointer decides for itself (a
/// fused kernel mixes a rank's shard buffers with peers' buffers at the block's offset,
/// aligned differently when N/P is not a multiple of 4); the loop steps by four
/// elements, so each branch is the same for a whole warp.
fn vec_load(b: &mut String, name: &str, at: &str, d: DType) {
    let w = vec_width_bytes(d).expect("vector dtype");
    let (reg, vector, scalar) = match d {
        DType::F32 => (
            "float",
            format!(
                "const float4 v = *(const float4*)&{at}; {name}_0 = v.x; {name}_1 = v.y; {name}_2 = v.z; {name}_3 = v.w;"
            ),
            (0..4)
                .map(|k| format!("{name}_{k} = (&{at})[{k}];"))
                .collect::<Vec<_>>()
                .join(" "),
        ),
        DType::F64 => (
            "double",
            format!(
                "const double2 v = *(const double2*)&{at}, u = *((const double2*)&{at} + 1); {name}_0 = v.x; {name}_1 = v.y; {name}_2 = u.x; {name}_3 = u.y;"
            ),
            (0..4)
                .map(|k| format!("{name}_{k} = (&{at})[{k}];"))
                .collect::<Vec<_>>()
                .join(" "),
        ),
        DType::F16 | DType::BF16 => {
            let f = if d == DType::F16 {
                "cc_half_to_float"
            } else {
                "cc_bhalf_to_float"
            };
            (
                "float",
                format!(
                    "const uint2 v = *(const uint2*)&{at}; {name}_0 = {f}((cc_half)(v.x & 0xffff)); {name}_1 = {f}((cc_half)(v.x >> 16)); {name}_2 = {f}((cc_half)(v.y & 0xffff)); {name}_3 = {f}((cc_half)(v.y >> 16));"
                ),
                (0..4)
                    .map(|k| format!("{name}_{k} = {f}((&{at})[{k}]);"))
                    .collect::<Vec<_>>()
                    .join(" "),
            )
        }
        _ => unreachable!("no vector path for {d}"),
    };
    let _ = writeln!(
        b,
        "      {reg} {name}_0, {name}_1, {name}_2, {name}_3;\n      if (((cc_u64)&{at} % {w}) == 0) {{ {vector} }} else {{ {scalar} }}"
    );
}

/// Stores registers `reg_0..reg_3` as four elements at `at`: one vector store where `at`
/// is aligned, else four scalar stores (see [`vec_load`]).
fn vec_store(b: &mut String, at: &str, d: DType, reg: &str) {
    let w = vec_width_bytes(d).expect("vector dtype");
    let (vector, scalar) = match d {
        DType::F32 => (
            format!(
                "float4 v; v.x = {reg}_0; v.y = {reg}_1; v.z = {reg}_2; v.w = {reg}_3; *(float4*)&{at} = v;"
            ),
            (0..4)
                .map(|k| format!("(&{at})[{k}] = {reg}_{k};"))
                .collect::<Vec<_>>()
                .join(" "),
        ),
        DType::F64 => (
            format!(
                "double2 v, u; v.x = {reg}_0; v.y = {reg}_1; u.x = {reg}_2; u.y = {reg}_3; *(double2*)&{at} = v; *((double2*)&{at} + 1) = u;"
            ),
            (0..4)
                .map(|k| format!("(&{at})[{k}] = {reg}_{k};"))
                .collect::<Vec<_>>()
                .join(" "),
        ),
        DType::F16 | DType::BF16 => {
            let f = if d == DType::F16 {
                "cc_float_to_half"
            } else {
                "cc_float_to_bhalf"
            };
            (
                format!(
                    "uint2 v; v.x = (unsigned){f}({reg}_0) | ((unsigned){f}({reg}_1) << 16); v.y = (unsigned){f}({reg}_2) | ((unsigned){f}({reg}_3) << 16); *(uint2*)&{at} = v;"
                ),
                (0..4)
                    .map(|k| format!("(&{at})[{k}] = {f}({reg}_{k});"))
                    .collect::<Vec<_>>()
                    .join(" "),
            )
        }
        _ => unreachable!("no vector path for {d}"),
    };
    let _ = writeln!(
        b,
        "      if (((cc_u64)&{at} % {w}) == 0) {{ {vector} }} else {{ {scalar} }}"
    );
}

/// The elements an operand read through `access` covers, from its base.
fn footprint(access: &Access) -> PtrUse {
    match access {
        Access::Splat { .. } => PtrUse::ReadsFixed(1),
        Access::Contiguous { .. } => PtrUse::ReadsAt,
        Access::Cyclic { period, .. } => PtrUse::ReadsFixed(*period),
        Access::Strided { shape, strides, .. } => PtrUse::ReadsFixed(
            1 + shape
                .iter()
                .zip(strides)
                .map(|(&n, &s)| n.saturating_sub(1) * s)
                .sum::<usize>(),
        ),
    }
}
