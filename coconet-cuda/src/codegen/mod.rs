//! CUDA C generated from a [`Plan`]: one translation unit per plan (compiled once by
//! NVRTC and cached), and for every step the launches each rank makes.
//!
//! - pointwise kernels and layer norms: `kernel`, one kernel per fusion group;
//! - fused all-reduces: the same generator with a reduction from every peer's memory
//!   first and writes into every peer's memory last (peer pointers, or same-device
//!   pointers for virtual ranks) — reduce my chunk, compute, write to every peer;
//! - collectives over peer memory: one `collect` kernel per (dtypes, operation, number
//!   of sources and destinations): `dst[d][i] = reduce_s src[s][i]`, the sources in
//!   rank order so every rank's result is bitwise the same;
//! - full reductions in the reference order (`coconet_core::numerics::ReduceAcc`): a block of 256
//!   threads per 2048 elements (coalesced loads, a shared-memory tree), then the same
//!   over the block results until one is left — bitwise equal to the interpreter and as
//!   wide as the tensor;
//! - matmuls are not generated: they are cuBLAS calls (or the host gemm in the
//!   emulator), described by [`MatMul`].
//!
//! Kernels with identical source are emitted once; names tell the step they were made
//! for (`s3_kernel`, `s5_fused`, ...).

pub(crate) mod args;
pub(crate) mod kernel;
pub(crate) mod prelude;
pub(crate) mod segments;

pub use args::{Arg, Mode, PtrArg, PtrUse};
use coconet_core::Collective;
use coconet_core::numerics::tensor::numel;
use coconet_core::numerics::{REDUCE_BLOCK, REDUCE_LANES};
use coconet_core::{DType, Direction, Layout, Op, ReduceKind, ReduceOp, ValueId, block_range};
use coconet_plan::RuntimeError;
use coconet_plan::plan::{
    Access, BufferRef, FusedAllGather, FusedAllReduce, Gather, Plan, PlanStep,
};
use kernel::{KernelGen, Reduction, Scatter, mem_type};
use std::collections::HashMap;
use std::fmt::Write;

/// One kernel launch of one rank.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    /// The rank launching it.
    pub rank: usize,
    /// Index into [`CudaProgram::kernels`].
    pub kernel: usize,
    /// Positions `lo..hi` of the iteration space.
    pub lo: usize,
    /// End of the range.
    pub hi: usize,
    /// How positions map to threads.
    pub mode: Mode,
    /// Arguments, in parameter order.
    pub args: Vec<Arg>,
}

impl Launch {
    /// Threads wanted for positions `lo..hi`.
    pub fn threads(&self, lo: usize, hi: usize) -> usize {
        let n = hi.saturating_sub(lo);
        match self.mode {
            Mode::Elements => n,
            Mode::Vector => n.div_ceil(4),
            // (The last row may be partial: a kernel folding reductions per block.)
            Mode::Rows(h) => n.div_ceil(h.max(1)) * coconet_core::numerics::ROW_LANES,
            Mode::Threads(t) => t,
            Mode::Blocks => n * REDUCE_LANES,
        }
    }
}

/// A matmul of one rank: `out[m, n] = a[m, k] × b[k, n]` on row-major buffers.
#[derive(Debug, Clone, PartialEq)]
pub struct MatMul {
    /// The rank.
    pub rank: usize,
    /// Left operand (dtype of the program's `a`).
    pub a: PtrArg,
    /// Right operand.
    pub b: PtrArg,
    /// Result.
    pub out: PtrArg,
    /// Rows of `a` and `out` (all leading dims together).
    pub m: usize,
    /// Inner dim.
    pub k: usize,
    /// Columns of `b` and `out`.
    pub n: usize,
    /// Element type (operands and result share it).
    pub dtype: DType,
    /// Rows of `out` per block of its first dim (the unit of overlap).
    pub rows_per_block: usize,
}

/// What the executor does for one plan step.
#[derive(Debug, Clone, PartialEq)]
pub enum GpuStep {
    /// Scalars computed on the host.
    Uniform(Vec<ValueId>),
    /// Kernel launches, in order.
    Launch(Vec<Launch>),
    /// Matmuls (cuBLAS).
    MatMul(Vec<MatMul>),
    /// A matmul computed by blocks of its first dim, each block's rows handed to the
    /// fused all-reduce as soon as every rank has computed them.
    Overlap {
        /// Every rank's matmul.
        matmuls: Vec<MatMul>,
        /// Blocks of the first dim.
        blocks: usize,
        /// Every rank's fused all-reduce launch over its whole block.
        fused: Vec<Launch>,
        /// For each fused launch: the first-dim rows its positions start at, and the
        /// positions per row.
        rows: Vec<(usize, usize)>,
    },
}

/// A generated kernel.
#[derive(Debug, Clone, PartialEq)]
pub struct Kernel {
    /// Its name in the translation unit.
    pub name: String,
    /// Its source (without the prelude).
    pub source: String,
    /// Its parameters' C types, in order (used by the emulator's launch wrappers).
    pub params: Vec<String>,
    /// Whether its threads cooperate (shared memory, barriers): the emulator then runs
    /// it once per block, the kernel looping over its threads between barriers.
    pub per_block: bool,
    /// The index of its segmented twin (an elementwise kernel's launch over a buffer
    /// lent as pieces, one segment per piece, in one launch), where it has one.
    pub segments: Option<usize>,
}

/// A plan compiled to CUDA C and launch lists.
#[derive(Debug, Clone, PartialEq)]
pub struct CudaProgram {
    /// The distinct kernels.
    pub kernels: Vec<Kernel>,
    /// One entry per plan step.
    pub steps: Vec<GpuStep>,
    /// Doubles of scratch memory each rank needs (at least one).
    pub scratch: usize,
}

impl CudaProgram {
    /// Generates the kernels and launches of `plan`.
    pub fn generate(plan: &Plan) -> Result<CudaProgram, RuntimeError> {
        let mut g = Gen {
            plan,
            kernels: vec![],
            by_source: HashMap::new(),
            scratch: 1,
        };
        let steps = plan
            .steps()
            .iter()
            .enumerate()
            .map(|(i, s)| g.step(i, s))
            .collect::<Result<Vec<_>, String>>()
            .map_err(|e| RuntimeError::Plan(format!("CUDA code generation: {e}")))?;
        Ok(CudaProgram {
            kernels: g.kernels,
            steps,
            scratch: g.scratch,
        })
    }

    /// The translation unit: the prelude, coconet's f64 math (so transcendental
    /// functions give the interpreter's bits) and every kernel.
    pub fn source(&self) -> String {
        let mut s = String::from(prelude::PRELUDE);
        s.push_str(coconet_core::math::CUDA_SOURCE);
        s.push_str(&self.kernels_source());
        s
    }

    /// Every kernel, without the prelude (what snapshots show).
    pub fn kernels_source(&self) -> String {
        self.kernels
            .iter()
            .filter(|k| !k.source.is_empty())
            .map(|k| format!("\n{}", k.source))
            .collect()
    }

    /// The translation unit for the host emulator: the source plus, for every kernel, an
    /// `extern "C" void NAME_launch(void** args, unsigned grid, unsigned block)` running
    /// its blocks and threads one after another (the kernels never synchronise threads).
    pub fn emulator_source(&self) -> String {
        let mut s = String::from("#define COCONET_EMULATE 1\n");
        s.push_str(&self.source());
        for k in &self.kernels {
            // A block-level kernel loops over its threads itself.
            let threads = if k.per_block { "1" } else { "block" };
            let args: Vec<String> = k
                .params
                .iter()
                .enumerate()
                .map(|(i, t)| format!("*({t}*)a[{i}]"))
                .collect();
            let _ = write!(
                s,
                "\nextern \"C\" void {name}_launch(void** a, unsigned grid, unsigned block) {{\n  gridDim = {{grid, 1, 1}}; blockDim = {{block, 1, 1}};\n  for (unsigned b = 0; b < grid; b++)\n    for (unsigned t = 0; t < {threads}; t++) {{\n      blockIdx = {{b, 0, 0}}; threadIdx = {{t, 0, 0}};\n      {name}({args});\n    }}\n}}\n",
                name = k.name,
                args = args.join(", "),
            );
        }
        s
    }

    /// The kernels and launches, for reading and for snapshot tests.
    pub fn describe(&self, plan: &Plan) -> String {
        let mut s = String::new();
        for (i, (step, gs)) in plan.steps().iter().zip(&self.steps).enumerate() {
            let _ = writeln!(s, "step {i}: {}", plan.describe(step));
            let launch = |l: &Launch| {
                format!(
                    "  rank {}: {}[{}..{}] {:?}",
                    l.rank, self.kernels[l.kernel].name, l.lo, l.hi, l.mode
                )
            };
            match gs {
                GpuStep::Uniform(_) => {
                    let _ = writeln!(s, "  host");
                }
                GpuStep::Launch(ls) => {
                    for l in ls {
                        let _ = writeln!(s, "{}", launch(l));
                    }
                }
                GpuStep::MatMul(ms) => {
                    for m in ms {
                        let _ = writeln!(
                            s,
                            "  rank {}: gemm {}x{}x{} {}",
                            m.rank, m.m, m.k, m.n, m.dtype
                        );
                    }
                }
                GpuStep::Overlap {
                    matmuls,
                    blocks,
                    fused,
                    ..
                } => {
                    for m in matmuls {
                        let _ = writeln!(
                            s,
                            "  rank {}: gemm {}x{}x{} {} in {blocks} blocks",
                            m.rank, m.m, m.k, m.n, m.dtype
                        );
                    }
                    for l in fused {
                        let _ = writeln!(s, "{} as blocks finish", launch(l));
                    }
                }
            }
        }
        s
    }
}

/// Parameter C types of a kernel signature `CC_KERNEL NAME(T a, U b) {`.
fn param_types(source: &str) -> Vec<String> {
    let open = source.find('(').expect("signature");
    let close = source.find(')').expect("signature");
    source[open + 1..close]
        .split(", ")
        .flat_map(|p| {
            let p = p.trim();
            let (ty, _name) = p.rsplit_once(' ').expect("typed parameter");
            let ty = ty.replace("__restrict__", "");
            vec![ty.trim().to_string()]
        })
        .collect()
}

struct Gen<'a> {
    plan: &'a Plan,
    kernels: Vec<Kernel>,
    by_source: HashMap<String, usize>,
    /// Scratch doubles needed so far.
    scratch: usize,
}

impl Gen<'_> {
    /// The index of a kernel with this body (`NAME` stands for its name).
    fn kernel(&mut self, name: String, body: String) -> usize {
        if let Some(&k) = self.by_source.get(&body) {
            return k;
        }
        let k = self.kernels.len();
        // Variants of one step (ranks laid out differently) get distinct names.
        let taken = |n: &str| self.kernels.iter().any(|k| k.name == n);
        let name = if taken(&name) {
            (2..)
                .map(|v| format!("{name}_v{v}"))
                .find(|n| !taken(n))
                .expect("a free name")
        } else {
            name
        };
        let source = body.replacen("NAME", &name, 1);
        let params = param_types(&source);
        let per_block = source.contains("CC_THREADS");
        self.by_source.insert(body, k);
        if !segments::segmentable(&params, per_block, &source) {
            self.kernels.push(Kernel {
                params,
                per_block,
                name,
                source,
                segments: None,
            });
            return k;
        }
        let (source, twin) = segments::with_twin(&source, &name, &params);
        self.kernels.push(Kernel {
            params,
            per_block,
            name: name.clone(),
            source,
            segments: Some(k + 1),
        });
        // Its source is its plain kernel's.
        self.kernels.push(Kernel {
            params: twin,
            per_block: false,
            name: format!("{name}_segs"),
            source: String::new(),
            segments: None,
        });
        k
    }

    fn holders(&self, v: ValueId) -> Vec<usize> {
        self.plan.holders(v).collect()
    }

    fn ptr(&self, rank: usize, v: ValueId, offset: usize) -> Result<PtrArg, String> {
        let p = self.plan.program();
        let buffer = self.plan.buffer(v).ok_or_else(|| {
            format!(
                "`{}` has no buffer of its own (a view or a scalar); the CUDA backend needs \
                 one here",
                p.label(v)
            )
        })?;
        Ok(PtrArg {
            rank,
            buffer,
            offset,
        })
    }

    fn step(&mut self, i: usize, step: &PlanStep) -> Result<GpuStep, String> {
        let p = self.plan.program();
        Ok(match step {
            PlanStep::Uniform(vs) => GpuStep::Uniform(vs.clone()),
            PlanStep::Kernel(ms) => {
                let mut ls = vec![];
                for r in self.holders(ms[0]) {
                    let shape = self.plan.local_shape(ms[0], r);
                    let g = KernelGen::new(self.plan, r, shape, None, ms)?;
                    ls.push(self.launch(format!("s{i}_kernel"), r, g));
                }
                GpuStep::Launch(ls)
            }
            PlanStep::Op(v) => {
                let node = p.node(*v);
                match node.op {
                    Op::MatMul(..) => GpuStep::MatMul(
                        self.holders(*v)
                            .into_iter()
                            .map(|r| self.matmul(*v, r))
                            .collect::<Result<_, _>>()?,
                    ),
                    Op::LayerNorm { .. } => {
                        let mut ls = vec![];
                        for r in self.holders(*v) {
                            let shape = self.plan.local_shape(*v, r);
                            let g = KernelGen::new(self.plan, r, shape, None, &[*v])?;
                            ls.push(self.launch(format!("s{i}_layer_norm"), r, g));
                        }
                        GpuStep::Launch(ls)
                    }
                    Op::ReduceAll(kind, x) => GpuStep::Launch(self.reduce_all(i, *v, kind, x)?),
                    _ if node.op.is_communication() => GpuStep::Launch(self.collective(i, *v)?),
                    ref op => return Err(format!("{} has no CUDA lowering", op.name())),
                }
            }
            PlanStep::FusedAllReduce(f) => GpuStep::Launch(self.fused(i, f)?),
            PlanStep::FusedAllGather(f) => GpuStep::Launch(self.fused_gather(i, f)?),
            PlanStep::Overlap { matmul, consumer } => {
                let matmuls: Vec<MatMul> = self
                    .holders(*matmul)
                    .into_iter()
                    .map(|r| self.matmul(*matmul, r))
                    .collect::<Result<_, _>>()?;
                let fused = self.fused(i, consumer)?;
                let full = self.plan.shape(consumer.operand).to_vec();
                let inner = numel(&full[1..]);
                let q = self.plan.group_size();
                let rows = fused
                    .iter()
                    .map(|l| (block_range(full[0], q, l.rank % q).start, inner))
                    .collect();
                GpuStep::Overlap {
                    matmuls,
                    blocks: full[0].clamp(1, 8),
                    fused,
                    rows,
                }
            }
            PlanStep::Commit { target, update } => {
                let mut ls = vec![];
                for r in self.holders(*target) {
                    let n = numel(&self.plan.local_shape(*target, r));
                    let d = p.node(*target).ty.dtype;
                    let src = vec![self.ptr(r, *update, 0)?];
                    let dst = vec![PtrArg {
                        rank: r,
                        buffer: BufferRef::Input(*target),
                        offset: 0,
                    }];
                    ls.push(self.collect(i, r, "commit", ReduceOp::Sum, d, d, src, dst, n));
                }
                GpuStep::Launch(ls)
            }
        })
    }

    fn launch(&mut self, name: String, rank: usize, g: KernelGen) -> Launch {
        let gen_ = g.finish();
        let k = self.kernel(name, gen_.source);
        Launch {
            rank,
            kernel: k,
            lo: 0,
            hi: gen_.len,
            mode: gen_.mode,
            args: gen_.args,
        }
    }

    fn matmul(&self, v: ValueId, r: usize) -> Result<MatMul, String> {
        let p = self.plan.program();
        let Op::MatMul(a, b) = p.node(v).op else {
            unreachable!("matmul")
        };
        let (sa, sb) = (self.plan.local_shape(a, r), self.plan.local_shape(b, r));
        for x in [a, b] {
            let view = self
                .plan
                .view(x, r)
                .ok_or_else(|| format!("matmul operand `{}` has no storage", p.label(x)))?;
            if !matches!(view.access(&view.shape), Access::Contiguous { .. }) {
                return Err(format!(
                    "matmul operand `{}` is not contiguous on rank {r}; the CUDA backend \
                     multiplies contiguous operands only",
                    p.label(x)
                ));
            }
        }
        let va = self.plan.view(a, r).expect("checked");
        let vb = self.plan.view(b, r).expect("checked");
        let d = p.node(v).ty.dtype;
        if p.node(a).ty.dtype != d || p.node(b).ty.dtype != d {
            return Err("matmul operands and result must share a dtype on CUDA".into());
        }
        Ok(MatMul {
            rank: r,
            a: PtrArg {
                rank: r,
                buffer: va.buffer,
                offset: va.base,
            },
            b: PtrArg {
                rank: r,
                buffer: vb.buffer,
                offset: vb.base,
            },
            out: self.ptr(r, v, 0)?,
            m: numel(&sa[..sa.len() - 1]),
            k: sb[0],
            n: sb[1],
            dtype: d,
            rows_per_block: numel(&sa[1..sa.len() - 1]),
        })
    }

    fn fused(&mut self, i: usize, f: &FusedAllReduce) -> Result<Vec<Launch>, String> {
        let p = self.plan.program();
        let (rs, x, op) = (f.reduce_scatter, f.operand, f.op);
        let full = self.plan.shape(x).to_vec();
        let inner = numel(&full[1..]);
        let q = self.plan.group_size();
        let group = self.holders(x);
        let mut ls = vec![];
        for &me in &self.holders(rs) {
            let block = block_range(full[0], q, me % q);
            let offset = block.start * inner;
            let sources = group
                .iter()
                .map(|&s| self.ptr(s, x, offset))
                .collect::<Result<Vec<_>, _>>()?;
            let shape = self.plan.local_shape(rs, me);
            let red = Reduction {
                rs,
                op,
                sources,
                dtype: p.node(x).ty.dtype,
            };
            let n = numel(&shape);
            let mut g = KernelGen::new(self.plan, me, shape, Some(red), &f.kernel)?;
            self.send_gathered(&mut g, &f.gathers, &group, offset)?;
            // Each full reduction of a stage: folded by the kernel into its first level
            // (one f64 per reference block, at k·blocks for the k-th reduction), or,
            // where the kernel cannot fold (a row kernel), the stage written as f64 into
            // scratch at k·n; the remaining levels then run in the reference order.
            // (An empty block folds nothing: its first level, the identity, runs.)
            let fold = g.can_fold() && n > 0;
            let values = if fold {
                n.div_ceil(REDUCE_BLOCK).max(1)
            } else {
                n
            };
            let mut reduce = vec![];
            for (k, &v) in f.reductions.iter().enumerate() {
                let Op::ReduceAll(kind, x) = p.node(v).op else {
                    return Err(format!("`{}` is not a full reduction", p.label(v)));
                };
                let dest = Arg::Scratch {
                    rank: me,
                    offset: k * values,
                };
                if fold {
                    g.fold(x, kind, dest.clone())?;
                } else {
                    g.spill(x, dest.clone())?;
                }
                reduce.push((v, kind, dest));
            }
            ls.push(self.launch(format!("s{i}_fused"), me, g));
            let base = f.reductions.len() * values;
            let first = (!fold).then_some(("double", "in[i]"));
            for (v, kind, dest) in reduce {
                ls.extend(self.reduce_levels(i, me, v, kind, first, dest, values, base)?);
            }
        }
        // Updates whose gathered value has its own buffer copy it in afterwards.
        ls.extend(self.commit_gathered(i, &f.gathers)?);
        Ok(ls)
    }

    /// A kernel over each rank's block whose gathered stages are written into every
    /// peer's buffer (then updates with buffers of their own copy the gathered value).
    fn fused_gather(&mut self, i: usize, f: &FusedAllGather) -> Result<Vec<Launch>, String> {
        let first = f.kernel[0];
        let sent = f.gathers[0].sent;
        let full = self.plan.shape(sent).to_vec();
        let inner = numel(&full[1..]);
        let q = self.plan.group_size();
        let group = self.holders(sent);
        let mut ls = vec![];
        for &me in &self.holders(first) {
            let offset = block_range(full[0], q, me % q).start * inner;
            let shape = self.plan.local_shape(first, me);
            let mut g = KernelGen::new(self.plan, me, shape, None, &f.kernel)?;
            self.send_gathered(&mut g, &f.gathers, &group, offset)?;
            ls.push(self.launch(format!("s{i}_fused_gather"), me, g));
        }
        ls.extend(self.commit_gathered(i, &f.gathers)?);
        Ok(ls)
    }

    /// Makes kernel `g` write each gathered stage into every peer's buffer of its
    /// all-gather, at my block's `offset`.
    fn send_gathered(
        &self,
        g: &mut KernelGen<'_>,
        gathers: &[Gather],
        group: &[usize],
        offset: usize,
    ) -> Result<(), String> {
        for gather in gathers {
            let dests = group
                .iter()
                .map(|&s| self.ptr(s, gather.gather, offset))
                .collect::<Result<Vec<_>, _>>()?;
            g.scatter(Scatter {
                value: gather.sent,
                dests,
            })?;
        }
        Ok(())
    }

    /// Copies of gathered values into the updated inputs where they have buffers of
    /// their own.
    fn commit_gathered(&mut self, i: usize, gathers: &[Gather]) -> Result<Vec<Launch>, String> {
        let p = self.plan.program();
        let mut ls = vec![];
        for gather in gathers {
            if let Some(m) = gather.update
                && self.plan.storage(m) != self.plan.storage(gather.gather)
            {
                let value = gather.gather;
                for r in self.holders(m) {
                    let n = numel(&self.plan.local_shape(m, r));
                    let d = p.node(m).ty.dtype;
                    let src = vec![self.ptr(r, value, 0)?];
                    let dst = vec![self.ptr(r, m, 0)?];
                    ls.push(self.collect(i, r, "copy", ReduceOp::Sum, d, d, src, dst, n));
                }
            }
        }
        Ok(ls)
    }

    /// `dst[d][i] = reduce over s of src[s][i]` for `i < n`.
    #[allow(clippy::too_many_arguments)]
    fn collect(
        &mut self,
        i: usize,
        rank: usize,
        what: &str,
        op: ReduceOp,
        din: DType,
        dout: DType,
        src: Vec<PtrArg>,
        dst: Vec<PtrArg>,
        n: usize,
    ) -> Launch {
        let (ns, nd) = (src.len(), dst.len());
        let mut b = String::new();
        let _ = writeln!(
            b,
            "CC_KERNEL NAME(cc_i64 lo, cc_i64 hi, {} const* const* __restrict__ src, {}* const* __restrict__ dst) {{",
            mem_type(din),
            mem_type(dout)
        );
        let _ = writeln!(
            b,
            "  for (cc_i64 i = lo + cc_tid(); i < hi; i += cc_nthreads()) {{"
        );
        let loads: Vec<String> = (0..ns)
            .map(|k| format!("(double){}", kernel::from_mem(din, &format!("src[{k}][i]"))))
            .collect();
        // One source is a copy; dividing by 1 for `Avg` changes nothing.
        let e = kernel::reduce_expr(op, &loads);
        let _ = writeln!(b, "    const double v = {e};");
        for k in 0..nd {
            let _ = writeln!(b, "    dst[{k}][i] = {};", kernel::store_rounded(dout, "v"));
        }
        let _ = writeln!(b, "  }}");
        let _ = writeln!(b, "}}");
        let k = self.kernel(format!("s{i}_{what}"), b);
        Launch {
            rank,
            kernel: k,
            lo: 0,
            hi: n,
            mode: Mode::Elements,
            args: vec![Arg::Range, Arg::Reads(src), Arg::Writes(dst)],
        }
    }

    fn collective(&mut self, i: usize, v: ValueId) -> Result<Vec<Launch>, String> {
        let p = self.plan.program();
        let node = p.node(v);
        let q = self.plan.group_size();
        let dout = node.ty.dtype;
        let mut ls = vec![];
        let unsupported = || {
            format!(
                "the CUDA backend does not run `{}` ({}) on this layout yet",
                p.label(v),
                node.op.name()
            )
        };
        let Some((c, x)) = node.op.collective() else {
            return Err(unsupported());
        };
        for me in self.holders(v) {
            let din = p.node(x).ty.dtype;
            let group = self.holders(x);
            let (op, src, dst, n, what) = match c {
                Collective::AllReduce(op) => {
                    let total = numel(&self.plan.local_shape(x, me));
                    let b = block_range(total, q, me % q);
                    let src = group
                        .iter()
                        .map(|&s| self.ptr(s, x, b.start))
                        .collect::<Result<Vec<_>, _>>()?;
                    let dst = group
                        .iter()
                        .map(|&s| self.ptr(s, v, b.start))
                        .collect::<Result<Vec<_>, _>>()?;
                    (op, src, dst, b.len(), "all_reduce")
                }
                Collective::ReduceScatter(op, 0) => {
                    let shape = self.plan.shape(x);
                    let inner = numel(&shape[1..]);
                    let b = block_range(shape[0], q, me % q);
                    let src = group
                        .iter()
                        .map(|&s| self.ptr(s, x, b.start * inner))
                        .collect::<Result<Vec<_>, _>>()?;
                    (
                        op,
                        src,
                        vec![self.ptr(me, v, 0)?],
                        b.len() * inner,
                        "reduce_scatter",
                    )
                }
                Collective::AllGather if p.node(x).ty.layout == Layout::Sliced(0) => {
                    let shape = self.plan.shape(v);
                    let inner = numel(&shape[1..]);
                    let b = block_range(shape[0], q, me % q);
                    let dst = group
                        .iter()
                        .map(|&s| self.ptr(s, v, b.start * inner))
                        .collect::<Result<Vec<_>, _>>()?;
                    (
                        ReduceOp::Sum,
                        vec![self.ptr(me, x, 0)?],
                        dst,
                        b.len() * inner,
                        "all_gather",
                    )
                }
                Collective::Broadcast(root) => {
                    let from = group[0] + root;
                    let n = numel(&self.plan.local_shape(v, me));
                    (
                        ReduceOp::Sum,
                        vec![self.ptr(from, x, 0)?],
                        vec![self.ptr(me, v, 0)?],
                        n,
                        "broadcast",
                    )
                }
                Collective::Reduce(op, root) => {
                    let n = numel(&self.plan.local_shape(v, me));
                    let src = if me == group[0] + root {
                        group
                            .iter()
                            .map(|&s| self.ptr(s, x, 0))
                            .collect::<Result<Vec<_>, _>>()?
                    } else {
                        vec![self.ptr(me, x, 0)?]
                    };
                    (op, src, vec![self.ptr(me, v, 0)?], n, "reduce")
                }
                Collective::Send(dir) => {
                    let from = match dir {
                        Direction::Next => me - q,
                        Direction::Prev => me + q,
                    };
                    let n = numel(&self.plan.local_shape(v, me));
                    (
                        ReduceOp::Sum,
                        vec![self.ptr(from, x, 0)?],
                        vec![self.ptr(me, v, 0)?],
                        n,
                        "send",
                    )
                }
                // Slices along other dims and gathers of them: not yet.
                Collective::ReduceScatter(..) | Collective::AllGather => {
                    return Err(unsupported());
                }
            };
            if let Collective::AllReduce(_)
            | Collective::ReduceScatter(..)
            | Collective::Reduce(..) = c
            {
                // Reductions of scalars held as host values have no buffers.
                if self.plan.buffer(x).is_none() {
                    return Err(unsupported());
                }
            }
            ls.push(self.collect(i, me, what, op, din, dout, src, dst, n));
        }
        Ok(ls)
    }

    fn reduce_all(
        &mut self,
        i: usize,
        v: ValueId,
        kind: ReduceKind,
        x: ValueId,
    ) -> Result<Vec<Launch>, String> {
        let p = self.plan.program();
        let din = p.node(x).ty.dtype;
        let mut ls = vec![];
        for r in self.holders(v) {
            let view = self
                .plan
                .view(x, r)
                .ok_or_else(|| format!("`{}` has no storage", p.label(x)))?;
            let n = numel(&view.shape);
            // Element i of the (possibly strided) view, row-major.
            let rank = view.shape.len();
            let mut at = String::from("0");
            for k in 0..rank {
                let inner: usize = view.shape[k + 1..].iter().product();
                at = format!(
                    "{at} + ((i / {}ll) % {}ll) * {}ll",
                    inner.max(1),
                    view.shape[k].max(1),
                    view.strides[k]
                );
            }
            let input = Arg::Ptr(
                PtrArg {
                    rank: r,
                    buffer: view.buffer,
                    offset: view.base,
                },
                PtrUse::Any,
            );
            let load = kernel::from_mem(din, &format!("in[{at}]"));
            let first = Some((mem_type(din), load.as_str()));
            ls.extend(self.reduce_levels(i, r, v, kind, first, input, n, 0)?);
        }
        Ok(ls)
    }

    /// The launches reducing `n` values of `input` (elements of C type `t`, element `i`
    /// read by `load`) into `v` on rank `r`, in the reference order
    /// ([`coconet_core::numerics::ReduceAcc`]): blocks of REDUCE_BLOCK values, one GPU
    /// block of REDUCE_LANES threads each (lane t folds values t, t + 256, ... of its
    /// block, coalesced), a shared-memory tree over the lanes; then the same over the
    /// block results, level after level, in scratch from double `base` on; a norm's
    /// square root and the rounding last. With `first` `None`, `input` already holds the
    /// first level's `n` block results (f64), folded by the kernel that computed the
    /// values.
    #[allow(clippy::too_many_arguments)]
    fn reduce_levels(
        &mut self,
        i: usize,
        r: usize,
        v: ValueId,
        kind: ReduceKind,
        first: Option<(&str, &str)>,
        input: Arg,
        n: usize,
        base: usize,
    ) -> Result<Vec<Launch>, String> {
        let dout = self.plan.program().node(v).ty.dtype;
        let [init, map, comb, fin] = kernel::reduce_terms(kind);
        let level = |t: &str, load: &str, map: &str| {
            let mut b = String::new();
            let _ = writeln!(
                b,
                "CC_KERNEL NAME(cc_i64 lo, cc_i64 hi, {t} const* __restrict__ in, cc_i64 n, double* __restrict__ out) {{"
            );
            let _ = writeln!(b, "  CC_SHARED double sh[{REDUCE_LANES}];");
            let _ = writeln!(
                b,
                "  for (cc_i64 blk = lo + blockIdx.x; blk < hi; blk += gridDim.x) {{"
            );
            let _ = writeln!(b, "    CC_THREADS(t)");
            let _ = writeln!(b, "      double s = {init};");
            kernel::lane_values(&mut b, "      ");
            let step = kernel::fold_step("s", &format!("(double){load}"), map, comb);
            let _ = writeln!(b, "        if (i < n) {step}");
            let _ = writeln!(b, "      }}");
            let _ = writeln!(b, "      sh[t] = s;");
            let _ = writeln!(b, "    CC_END_THREADS");
            kernel::shared_tree(&mut b, "sh", REDUCE_LANES, comb);
            let _ = writeln!(b, "    CC_THREADS(t)");
            let _ = writeln!(b, "      if (t == 0) out[blk] = sh[0];");
            let _ = writeln!(b, "    CC_END_THREADS");
            let _ = writeln!(b, "  }}");
            let _ = writeln!(b, "}}");
            b
        };
        let mut kernel =
            first.map(|(t, load)| self.kernel(format!("s{i}_reduce_blocks"), level(t, load, map)));
        let next_source = level("double", "in[i]", "x");
        let mut ls = vec![];
        // Level by level: (kernel, input, values in, scratch offset of the output). The
        // first level runs even over one value (the identity, as the reference's one
        // block); later levels while more than one value is left.
        let mut m = n;
        let mut input = input;
        let mut offset = base;
        while kernel.is_some() || m > 1 {
            let kernel = match kernel.take() {
                Some(k) => k,
                None => self.kernel(format!("s{i}_reduce_levels"), next_source.clone()),
            };
            let blocks = m.div_ceil(REDUCE_BLOCK).max(1);
            ls.push(Launch {
                rank: r,
                kernel,
                lo: 0,
                hi: blocks,
                mode: Mode::Blocks,
                args: vec![
                    Arg::Range,
                    input,
                    Arg::I64(m as i64),
                    Arg::Scratch { rank: r, offset },
                ],
            });
            input = Arg::Scratch { rank: r, offset };
            m = blocks;
            offset += blocks;
        }
        // The total is in `input` (one value): the last level's output, or the kernel's
        // fold when that left one block.
        self.scratch = self.scratch.max(offset);
        let mut b = String::new();
        let _ = writeln!(
            b,
            "CC_KERNEL NAME(cc_i64 lo, cc_i64 hi, double const* __restrict__ in, {}* __restrict__ out) {{",
            mem_type(dout)
        );
        let _ = writeln!(
            b,
            "  if (cc_tid() == 0) {{\n    const double s = in[0];\n    const double v = {fin};\n    out[0] = {};\n  }}\n}}",
            kernel::store_rounded(dout, "v")
        );
        let last = self.kernel(format!("s{i}_reduce_final"), b);
        ls.push(Launch {
            rank: r,
            kernel: last,
            lo: 0,
            hi: 1,
            mode: Mode::Threads(1),
            args: vec![Arg::Range, input, Arg::Ptr(self.ptr(r, v, 0)?, PtrUse::Any)],
        });
        Ok(ls)
    }
}
