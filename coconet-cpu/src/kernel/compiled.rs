//! A kernel lowered to a [`jit::Graph`] and run as machine code, chunk by chunk: the
//! same chunks, registers and stores as the stage loops, with the stages computed per
//! element in vector registers. Only the registers something outside the kernel reads
//! (a gather, a folded reduction, a store the code cannot do) are written.
//!
//! A kernel compiles when every stage it computes is an f32 stage of the f32 path
//! (exactly rounded, narrow operands) whose operation a graph expresses, and every
//! operand is a register, a constant or a plain f32 buffer read in place. The results
//! are then the stage loops' bits (see [`jit`]). One more condition keeps the order of
//! memory accesses equivalent: the stage loops store a stage's chunk before the next
//! stage reads, the code reads every operand of an element before it stores. So a
//! buffer written by the kernel may be read only at the same positions and only by
//! stages up to the writing one, and stores the code cannot do (into f16 or bf16
//! buffers), made after it, must meet no other access; anything else runs on the stage
//! loops.
//!
//! A fused all-reduce's kernel may also compute its first preset register, the reduced
//! chunk ([`Reduction`]): the code then reads every rank's operand where it lies and
//! sums it in f64 in rank order, as the reduction pass would, in the same loop as the
//! stages — the reduced register is written only if something reads it.

use super::stage::{Reduction, Src, View};
use crate::array::Mapping;
use crate::jit::{self, Graph, Node};
use coconet_core::{BinaryOp, DType, Op, Program, ReduceOp, UnaryOp, ValueId};
use coconet_plan::host::memory::Raw;

/// A compiled kernel: its code, and where each pointer and scalar argument comes from.
#[derive(Debug)]
pub(super) struct Compiled {
    code: jit::Code,
    /// Pointer arguments, inputs then outputs.
    pointers: Vec<Pointer>,
    scalars: Vec<f32>,
    /// Per stage: the code stores its chunk (the other stored stages are stored from
    /// their registers after the code ran).
    stored: Vec<bool>,
    /// Per register: written by the code each chunk.
    pub(super) kept: Vec<bool>,
    /// The code computes the first preset stage (a [`Reduction`]).
    pub(super) reduces: bool,
}

/// Where a pointer argument points, for the chunk at `start`.
#[derive(Debug, Clone, Copy)]
enum Pointer {
    /// The start of register `r`.
    Reg(usize),
    /// Element `base + (start − origin)` of an f32 buffer (`origin` is 0 but for a
    /// reduction's sources, see [`Reduction`]).
    Mem {
        raw: Raw,
        base: usize,
        origin: usize,
    },
}

/// How a graph computes an f32 stage of an operation, from the nodes of its operands.
#[derive(Clone, Copy)]
enum Lowering {
    /// The operand's values, unchanged (an update's new value; a cast to f32 of f32
    /// lanes, which hold f32 values whatever the operand's narrow dtype).
    Pass,
    /// A new node from the operands' nodes.
    Node(fn(&[usize]) -> Node),
}

/// The one mapping from operations to graph nodes ([`expressible`] and
/// [`Compiled::new`] both read it).
fn lowering(op: &Op) -> Option<Lowering> {
    use Lowering::{Node as N, Pass};
    Some(match op {
        Op::Cast(_) | Op::Update { .. } => Pass,
        Op::Select(..) => N(|a| Node::Select(a[0], a[1], a[2])),
        Op::Unary(UnaryOp::Neg, _) => N(|a| Node::Neg(a[0])),
        Op::Unary(UnaryOp::Abs, _) => N(|a| Node::Abs(a[0])),
        Op::Unary(UnaryOp::Sqrt, _) => N(|a| Node::Sqrt(a[0])),
        Op::Binary(BinaryOp::Add, ..) => N(|a| Node::Add(a[0], a[1])),
        Op::Binary(BinaryOp::Sub, ..) => N(|a| Node::Sub(a[0], a[1])),
        Op::Binary(BinaryOp::Mul, ..) => N(|a| Node::Mul(a[0], a[1])),
        Op::Binary(BinaryOp::Div, ..) => N(|a| Node::Div(a[0], a[1])),
        _ => return None,
    })
}

/// Whether a graph expresses `op` (computed on f32 operands into an f32 stage).
pub(super) fn expressible(op: &Op) -> bool {
    lowering(op).is_some()
}

/// Per stage of a kernel over `ids`: whether a value outside the kernel reads it, or the
/// program returns it.
pub(super) fn read_outside(p: &Program, ids: &[ValueId]) -> Vec<bool> {
    let mut live = vec![false; ids.len()];
    let stage = |v: ValueId| ids.iter().position(|&i| i == v);
    for (id, node) in p.ids().zip(p.nodes()) {
        if stage(id).is_none() {
            for o in node.op.operands() {
                if let Some(i) = stage(o) {
                    live[i] = true;
                }
            }
        }
    }
    for &o in p.outputs() {
        if let Some(i) = stage(o) {
            live[i] = true;
        }
    }
    live
}

/// The memory a stage reads or writes over the kernel: the byte ranges of its elements
/// in order (one per piece of a pieced buffer), the same sorted by address, and the
/// stage.
struct Access {
    bytes: Vec<std::ops::Range<usize>>,
    sorted: Vec<std::ops::Range<usize>>,
    stage: usize,
}

impl Access {
    fn new(raw: &Raw, base: usize, len: usize, stage: usize) -> Access {
        let size = raw.dtype.size_bytes();
        let mut bytes = Vec::new();
        raw.runs(base, len, |piece, at, range| {
            let start = piece.addr() as usize + size * at;
            bytes.push(start..start + size * range.len());
        });
        let mut sorted = bytes.clone();
        sorted.sort_unstable_by_key(|r| r.start);
        Access {
            bytes,
            sorted,
            stage,
        }
    }

    /// Whether any byte is in both: one sweep over the two sorted lists (a model's
    /// buffers have a piece per tensor, hundreds of them).
    fn meets(&self, o: &Access) -> bool {
        let (mut i, mut j) = (0, 0);
        while i < self.sorted.len() && j < o.sorted.len() {
            let (a, b) = (&self.sorted[i], &o.sorted[j]);
            if a.start < b.end && b.start < a.end && !a.is_empty() && !b.is_empty() {
                return true;
            }
            if a.end <= b.end {
                i += 1;
            } else {
                j += 1;
            }
        }
        false
    }

    /// Whether both put every element at the same address.
    fn same_positions(&self, o: &Access) -> bool {
        self.bytes == o.bytes
    }
}

/// A kernel's graph as it is built: the pointers and scalars its code takes (in the
/// order of its arguments), the memory it reads, and the node holding each stage.
struct Builder {
    g: Graph,
    pointers: Vec<Pointer>,
    scalars: Vec<f32>,
    reads: Vec<Access>,
    /// The node holding each stage's values.
    node_of: Vec<usize>,
}

impl Builder {
    fn push(&mut self, node: Node) -> usize {
        self.g.nodes.push(node);
        self.g.nodes.len() - 1
    }

    /// A node loading from `pointer`, the code's next pointer argument.
    fn load(&mut self, pointer: Pointer) -> usize {
        let node = self.push(Node::Load(self.pointers.len()));
        self.pointers.push(pointer);
        node
    }

    /// The preset registers: loaded, or the first computed as `reduction`; `None`
    /// where one is not narrow or the reduction does not compile.
    fn presets(&mut self, k: View<'_>, reduction: Option<Reduction<'_>>) -> Option<()> {
        for i in 0..k.preset {
            if !k.narrow[i] {
                return None;
            }
            self.node_of[i] = match reduction.filter(|_| i == 0) {
                Some(r) => self.reduced(k, i, r)?,
                None => self.load(Pointer::Reg(i)),
            };
        }
        Some(())
    }

    /// The reduction `r` in rank order, in f64, rounded once: what
    /// `collective::reduce_f32_slices` computes (stage i its result).
    fn reduced(&mut self, k: View<'_>, i: usize, r: Reduction<'_>) -> Option<usize> {
        if !super::stage::reduction_compiles(r.op, k.stages[i].dtype) || r.sources.is_empty() {
            return None;
        }
        let mean = (r.op == ReduceOp::Avg).then(|| {
            self.scalars.push(r.sources.len() as f32);
            self.scalars.len() - 1
        });
        let first = self.g.nodes.len();
        for &(raw, base) in r.sources {
            if !raw.holds_f32(base, r.len) {
                return None;
            }
            self.reads.push(Access::new(&raw, base, r.len, i));
            self.load(Pointer::Mem {
                raw,
                base,
                origin: r.origin,
            });
        }
        let count = r.sources.len();
        Some(self.push(Node::Sum { first, count, mean }))
    }

    /// The stages the kernel computes, each from its operands' nodes; `None` where one
    /// is not an f32 stage a graph expresses or reads memory the code cannot.
    fn stages(&mut self, k: View<'_>) -> Option<()> {
        for i in k.preset..k.stages.len() {
            let stage = &k.stages[i];
            if k.reg[i] != i {
                self.node_of[i] = self.node_of[k.reg[i]];
                continue;
            }
            if !k.in_f32[i] || stage.dtype != DType::F32 {
                return None;
            }
            let lowering = lowering(&stage.op)?;
            // An update reads only its new value.
            let used: &[Src] = match stage.op {
                Op::Update { .. } => &stage.srcs[1..],
                _ => &stage.srcs,
            };
            let mut args = Vec::with_capacity(used.len());
            for src in used {
                let node = match src {
                    Src::Reg(j) => self.node_of[*j],
                    Src::Mem(Mapping::Splat(x)) => {
                        self.scalars.push(*x as f32);
                        self.push(Node::Scalar(self.scalars.len() - 1))
                    }
                    Src::Mem(Mapping::Contiguous { raw, base }) if raw.holds_f32(*base, k.len) => {
                        self.reads.push(Access::new(raw, *base, k.len, i));
                        self.load(Pointer::Mem {
                            raw: *raw,
                            base: *base,
                            origin: 0,
                        })
                    }
                    Src::Mem(_) => return None,
                };
                args.push(node);
            }
            self.node_of[i] = match lowering {
                Lowering::Pass => args[0],
                Lowering::Node(node) => self.push(node(&args)),
            };
        }
        Some(())
    }

    /// Stores: into plain f32 buffers by the code, the others after it from registers.
    /// Returns, per stage, whether the code stores it; the code's writes; and the
    /// stores made after it.
    fn stores(&mut self, k: View<'_>) -> (Vec<bool>, Vec<Access>, Vec<Access>) {
        let mut stored = vec![false; k.stages.len()];
        let (mut writes, mut late): (Vec<Access>, Vec<Access>) = (Vec::new(), Vec::new());
        for (i, stage) in k.stages.iter().enumerate().skip(k.preset) {
            let Some(Mapping::Contiguous { raw, base }) = &stage.store else {
                continue;
            };
            if raw.holds_f32(*base, k.len) {
                writes.push(Access::new(raw, *base, k.len, i));
                self.g.outputs.push(self.node_of[i]);
                self.pointers.push(Pointer::Mem {
                    raw: *raw,
                    base: *base,
                    origin: 0,
                });
                stored[i] = true;
            } else {
                // Stored after the code ran: it must not meet any other access.
                late.push(Access::new(raw, *base, k.len, i));
            }
        }
        (stored, writes, late)
    }

    /// The registers the code writes (per register): those something outside the code
    /// reads — a `live` stage, a store made after the code, the reduced register where
    /// it is live or kept.
    fn kept(
        &mut self,
        k: View<'_>,
        live: &[bool],
        reduction: Option<Reduction<'_>>,
        stored: &[bool],
    ) -> Vec<bool> {
        let n = k.stages.len();
        let reduces = reduction.is_some();
        let mut kept = vec![false; n];
        if reduces && (live[0] || reduction.is_some_and(|r| r.keep)) {
            self.g.outputs.push(self.node_of[0]);
            self.pointers.push(Pointer::Reg(0));
            kept[0] = true;
        }
        // Registers the code fills: the kernel's own, and the reduced one.
        let filled = |r: usize| r >= k.preset || (reduces && r == 0);
        for i in k.preset..n {
            let r = k.reg[i];
            let stored_after =
                matches!(k.stages[i].store, Some(Mapping::Contiguous { .. })) && !stored[i];
            if (live[i] || stored_after) && filled(r) && !kept[r] {
                self.g.outputs.push(self.node_of[i]);
                self.pointers.push(Pointer::Reg(r));
                kept[r] = true;
            }
        }
        kept
    }
}

/// Whether the code's accesses keep the stage loops' order: every read of memory the
/// code writes is of the same positions, by a stage up to the writer's; memory the code
/// writes twice is written at the same positions (in stage order on both paths); stores
/// after the code meet nothing else (see the module docs).
fn in_order(reads: &[Access], writes: &[Access], late: &[Access]) -> bool {
    for (k, w) in writes.iter().enumerate() {
        let reordered = reads
            .iter()
            .any(|r| r.meets(w) && (!r.same_positions(w) || r.stage > w.stage));
        let shifted = writes[k + 1..]
            .iter()
            .any(|o| o.meets(w) && !o.same_positions(w));
        if reordered || shifted {
            return false;
        }
    }
    for (k, l) in late.iter().enumerate() {
        let mut others = reads.iter().chain(writes).chain(&late[k + 1..]);
        if others.any(|a| a.meets(l)) {
            return false;
        }
    }
    true
}

impl Compiled {
    /// The kernel as code, or `None` if it does not compile (see the module docs) or
    /// compilation is off.
    pub(super) fn new(
        k: View<'_>,
        live: &[bool],
        reduction: Option<Reduction<'_>>,
    ) -> Option<Compiled> {
        let mut b = Builder {
            g: Graph::default(),
            pointers: Vec::new(),
            scalars: Vec::new(),
            reads: Vec::new(),
            node_of: vec![usize::MAX; k.stages.len()],
        };
        b.presets(k, reduction)?;
        b.stages(k)?;
        b.g.inputs = b.pointers.len();
        b.g.scalars = b.scalars.len();
        let (stored, writes, late) = b.stores(k);
        let kept = b.kept(k, live, reduction, &stored);
        if b.g.outputs.is_empty() {
            // Nothing to compute (e.g. a reduced chunk only stored or sent).
            return None;
        }
        if !in_order(&b.reads, &writes, &late) {
            return None;
        }
        let code = jit::compile(&b.g)?;
        Some(Compiled {
            code,
            pointers: b.pointers,
            scalars: b.scalars,
            stored,
            kept,
            reduces: reduction.is_some(),
        })
    }

    /// Whether the code stores stage `i`'s chunk itself (the other stored stages are
    /// stored from their registers by the caller).
    pub(super) fn stores(&self, i: usize) -> bool {
        self.stored[i]
    }

    /// Computes positions `start..start + n` of the kernel (see `Kernel::chunk`) into
    /// its registers `r32` and the memory it stores itself: one call of the code per run
    /// of positions that lies in one piece of every pieced buffer.
    pub(super) fn chunk(&self, r32: &mut [Vec<f32>], start: usize, n: usize) {
        // Element of a buffer pointer at the chunk's start.
        let element = |base: usize, origin: usize| {
            base + start
                .checked_sub(origin)
                .expect("a reduction's chunks start at its origin")
        };
        let mut cuts = vec![0, n];
        for p in &self.pointers {
            if let Pointer::Mem { raw, base, origin } = p
                && raw.is_pieced()
            {
                raw.runs(element(*base, *origin), n, |_, _, range| {
                    cuts.push(range.start)
                });
            }
        }
        cuts.sort_unstable();
        cuts.dedup();
        for run in cuts.windows(2) {
            let (from, len) = (run[0], run[1] - run[0]);
            let pointers: Vec<*mut f32> = self
                .pointers
                .iter()
                .map(|p| match *p {
                    Pointer::Reg(r) => r32[r][from..from + len].as_mut_ptr(),
                    Pointer::Mem { raw, base, origin } => raw
                        .f32_ptr(element(base, origin) + from, len)
                        .expect("kernel operands are in bounds and runs in one piece"),
                })
                .collect();
            // SAFETY: every pointer is valid for `len` f32: registers hold `step` >= n,
            // buffers were checked just above (in bounds, one piece). Registers are
            // distinct vectors; buffer outputs are written at the same positions they
            // are read, if at all (checked when compiled), and no other thread touches
            // this rank's chunk (module docs of `host::memory`).
            unsafe { self.code.run(&pointers, &self.scalars, len) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(bytes: &[(usize, usize)]) -> Access {
        let bytes: Vec<_> = bytes.iter().map(|&(a, b)| a..b).collect();
        let mut sorted = bytes.clone();
        sorted.sort_unstable_by_key(|r| r.start);
        Access {
            bytes,
            sorted,
            stage: 0,
        }
    }

    /// Pieces interleaved in memory meet only where their bytes do, in either order of
    /// the two lists; touching ends and empty ranges do not meet.
    #[test]
    fn accesses_meet_where_their_pieces_overlap() {
        let a = access(&[(300, 400), (0, 100), (200, 250)]);
        let apart = access(&[(100, 200), (250, 300), (400, 500), (150, 150)]);
        let across = access(&[(500, 600), (240, 260)]);
        assert!(!a.meets(&apart) && !apart.meets(&a));
        assert!(a.meets(&across) && across.meets(&a));
        assert!(a.meets(&a));
        assert!(a.same_positions(&access(&[(300, 400), (0, 100), (200, 250)])));
        // The same bytes in another element order put elements elsewhere.
        assert!(!a.same_positions(&access(&[(0, 100), (300, 400), (200, 250)])));
    }
}
