//! The reference interpreter: executes a [`Program`] on P simulated ranks.
//!
//! It is the semantics oracle for every transformation and backend, so it is written to
//! be obviously correct rather than fast: every rank's copy of every value is an explicit
//! `Vec<f64>`, computed in f64 and rounded to the node's dtype after every node.
//! Collectives combine ranks in rank order 0, 1, .., Q-1.
//!
//! Notes on semantics it pins down:
//! - `i64` values are held in f64 and are exact up to 2^53.
//! - Integer division by zero gives 0 (the f64 result is not finite).
//! - `dropout` keeps logical element `i` iff `philox(seed, i) >= ceil(p·2^32)`, so every
//!   layout and chunking draws the same mask; kept values are scaled by `1/(1-p)`.

mod bindings;

use crate::Collective;
use bindings::Supplied;
pub use bindings::{Binding, Bindings, TensorArg};

use crate::numerics::philox;
use crate::numerics::tensor::{broadcast_map, concat_dim, numel, slice_dim};
use crate::{
    DType, Direction, Element, HostData, Layout, Op, Placement, Program, ReduceOp, ValueId,
    block_range,
};
use std::borrow::Cow;
use thiserror::Error;

/// Why a program could not be run with the given bindings.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum InterpError {
    /// P is zero or not a multiple of the number of groups.
    #[error(
        "cannot run `{program}` on {ranks} rank(s): it needs a positive multiple of its {groups} group(s)"
    )]
    Ranks {
        /// Program name.
        program: String,
        /// Requested rank count.
        ranks: usize,
        /// Groups of the program.
        groups: usize,
    },
    /// A symbolic dim is not bound.
    #[error("dimension `{dim}` (used by `{used_by}`) is not bound")]
    UnboundDim {
        /// The dim's name.
        dim: String,
        /// A value whose shape uses it.
        used_by: String,
    },
    /// No binding for a tensor or scalar input.
    #[error("input `{0}` is not bound")]
    Missing(String),
    /// A binding names something that is not an input of the program.
    #[error("`{name}` is bound but `{program}` has no {what} of that name")]
    Unknown {
        /// Program name.
        program: String,
        /// The bound name.
        name: String,
        /// "input" or "dimension".
        what: &'static str,
    },
    /// The bound data has the wrong dtype.
    #[error("input `{name}` is {expected} but was bound to {got} data")]
    DType {
        /// Input name.
        name: String,
        /// Declared dtype.
        expected: DType,
        /// Bound dtype.
        got: DType,
    },
    /// A buffer has the wrong number of elements.
    #[error("input `{name}`{rank}: expected {expected} elements for shape {shape}, got {got}")]
    Length {
        /// Input name.
        name: String,
        /// " on rank r" for per-rank buffers, "" otherwise.
        rank: String,
        /// The resolved (local) shape.
        shape: String,
        /// Expected element count.
        expected: usize,
        /// Bound element count.
        got: usize,
    },
    /// A per-rank binding has the wrong number of buffers.
    #[error("input `{name}`: expected one buffer per rank of its group ({expected}), got {got}")]
    RankCount {
        /// Input name.
        name: String,
        /// Group size.
        expected: usize,
        /// Buffers given.
        got: usize,
    },
    /// Per-rank copies of a Replicated input differ.
    #[error("input `{name}` is Replicated but rank {rank}'s copy differs from rank 0's")]
    NotReplicated {
        /// Input name.
        name: String,
        /// First differing rank (within the group).
        rank: usize,
    },
    /// A collective's root is not a rank of the group.
    #[error("`{op}` at `{value}` has root {root}, but its group has {group_size} rank(s)")]
    Root {
        /// The collective.
        op: &'static str,
        /// The stage.
        value: String,
        /// The root given.
        root: usize,
        /// Ranks per group.
        group_size: usize,
    },
    /// An i64 element beyond ±2^53, which no backend would carry exactly (elements
    /// travel as f64).
    #[error(
        "input `{name}` holds {value}, beyond ±2^53: i64 elements are exact only up to 2^53 in magnitude (they are computed as f64)"
    )]
    InexactI64 {
        /// Input name.
        name: String,
        /// The first such element.
        value: i64,
    },
    /// A tensor bound as pieces whose pieces differ between ranks.
    #[error("input `{name}`: rank {rank}'s pieces have other lengths than rank 0's")]
    Pieces {
        /// Input name.
        name: String,
        /// The first differing rank.
        rank: usize,
    },
    /// A value's size does not fit this machine's address space (element count or bytes
    /// overflow), so it cannot be allocated or indexed.
    #[error("{value} has shape {shape:?} of {dtype}: {why}")]
    TooLarge {
        /// The value (its name and operation).
        value: String,
        /// Its resolved shape.
        shape: Vec<usize>,
        /// Its dtype.
        dtype: DType,
        /// What overflowed.
        why: String,
    },
    /// Memory for a value could not be allocated.
    #[error("out of memory: {what} needs {bytes} bytes, which could not be allocated")]
    OutOfMemory {
        /// The value or buffer.
        what: String,
        /// The bytes asked for.
        bytes: usize,
    },
    /// A value was asked for in a way its layout does not allow, or does not exist.
    #[error("{0}")]
    Read(String),
}

/// The element count and bytes of a value of `shape` and `dtype` (stored in `bytes_per`
/// bytes per element), or why they do not fit in memory: products are checked, so a
/// shape whose size wraps around is an error instead of a small buffer.
pub fn checked_size(
    value: &str,
    shape: &[usize],
    dtype: DType,
    bytes_per: usize,
) -> Result<usize, InterpError> {
    let too_large = |why: String| InterpError::TooLarge {
        value: value.to_string(),
        shape: shape.to_vec(),
        dtype,
        why,
    };
    let elements = shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| too_large("its element count overflows usize".into()))?;
    match elements.checked_mul(bytes_per) {
        Some(b) if b <= isize::MAX as usize => Ok(elements),
        _ => Err(too_large(format!(
            "{elements} elements of {bytes_per} bytes exceed the largest possible allocation"
        ))),
    }
}

/// Reserves (and frees) `bytes` to learn early whether they can be allocated at all: an
/// allocation failure later would abort the process.
pub fn probe_allocation(what: &str, bytes: usize) -> Result<(), InterpError> {
    Vec::<u8>::new()
        .try_reserve_exact(bytes)
        .map_err(|_| InterpError::OutOfMemory {
            what: what.to_string(),
            bytes,
        })
}

/// The values of every node on every rank after running a program.
#[derive(Debug, Clone)]
pub struct Execution {
    program: Program,
    ranks: usize,
    group_size: usize,
    /// Resolved logical shape per node.
    shapes: Vec<Vec<usize>>,
    /// `values[node][world rank]`: `None` on ranks outside the node's group.
    values: Vec<Vec<Option<Vec<f64>>>>,
}

/// Runs `program` on `ranks` simulated ranks.
///
/// ```
/// use coconet_core::*;
/// let mut b = ProgramBuilder::new("sum");
/// let x = b.tensor_input("x", DType::F32, Layout::Local, Shape::new(vec![Dim::sym("N")]), 0).unwrap();
/// let y = b.all_reduce(ReduceOp::Sum, x).unwrap();
/// let p = b.finish();
/// let args = Bindings::new().dim("N", 2).tensor("x", Binding::per_rank(&[vec![1.0f32, 2.0], vec![3.0, 4.0]]));
/// let run = interpret(&p, 2, &args).unwrap();
/// assert_eq!(run.logical::<f32>(y).unwrap(), vec![4.0, 6.0]);
/// ```
pub fn interpret(
    program: &Program,
    ranks: usize,
    args: &Bindings,
) -> Result<Execution, InterpError> {
    let mut ex = prepare(program, ranks, args)?;
    for (id, shape) in program.ids().zip(&ex.shapes) {
        // Every value is held as f64 on every rank: refuse what cannot be allocated.
        let bytes = shape.iter().product::<usize>() * 8;
        probe_allocation(
            &format!("`{}` (as f64, per rank)", program.label(id)),
            bytes,
        )?;
    }
    for id in program.ids() {
        let v = ex.eval(id, args)?;
        let dtype = program.node(id).ty.dtype;
        let v = v
            .into_iter()
            .map(|r| r.map(|d| d.into_iter().map(|x| dtype.round(x)).collect()))
            .collect();
        ex.values.push(v);
    }
    Ok(ex)
}

/// Checks the rank count and the names of the bindings, and resolves every shape.
fn prepare(program: &Program, ranks: usize, args: &Bindings) -> Result<Execution, InterpError> {
    let group_size = program.group_size(ranks)?;
    check_names(program, args)?;
    let mut shapes = Vec::with_capacity(program.nodes().len());
    for id in program.ids() {
        let s = program
            .node(id)
            .ty
            .shape
            .resolve(&args.dims)
            .map_err(|dim| InterpError::UnboundDim {
                dim,
                used_by: program.label(id),
            })?;
        let node = program.node(id);
        let what = format!("`{}` ({})", program.label(id), node.op.name());
        checked_size(&what, &s, node.ty.dtype, 8)?;
        shapes.push(s);
    }
    Ok(Execution {
        program: program.clone(),
        ranks,
        group_size,
        shapes,
        values: Vec::with_capacity(program.nodes().len()),
    })
}

/// The inputs of a program laid out per rank, validated exactly as [`interpret`] does —
/// for backends, which must reject the same bindings before any communication starts.
#[derive(Debug, Clone)]
pub struct BoundInputs<'a> {
    /// Resolved logical shape of every value.
    pub shapes: std::collections::HashMap<ValueId, Vec<usize>>,
    /// Per tensor input: its data on each world rank (`None` outside its group).
    /// Borrowed from the bindings where a rank's data is what was bound (a whole
    /// Replicated tensor, a rank's buffer); owned where it was cut out (a Sliced block).
    pub tensors: std::collections::HashMap<ValueId, Vec<Option<Cow<'a, HostData>>>>,
    /// Per scalar input: its value.
    pub scalars: std::collections::HashMap<ValueId, f64>,
    /// Per tensor input bound as pieces: the pieces' lengths.
    pub pieces: std::collections::HashMap<ValueId, Vec<usize>>,
}

/// Validates `args` for running `program` on `ranks` ranks and lays the inputs out.
pub fn bind_inputs<'a>(
    program: &Program,
    ranks: usize,
    args: &'a Bindings,
) -> Result<BoundInputs<'a>, InterpError> {
    bind_inputs_for(program, ranks, args, None)
}

/// [`bind_inputs`] for one process that runs rank `rank` only: only that rank's data is
/// laid out (the other ranks' entries are `None`), and inputs may be bound with
/// [`TensorArg::ThisRank`]. Memory is O(N) per process, not O(P·N).
pub fn bind_rank_inputs<'a>(
    program: &Program,
    ranks: usize,
    rank: usize,
    args: &'a Bindings,
) -> Result<BoundInputs<'a>, InterpError> {
    if rank >= ranks {
        return Err(InterpError::Read(format!(
            "rank {rank} is not a rank of a {ranks}-rank job"
        )));
    }
    bind_inputs_for(program, ranks, args, Some(rank))
}

fn bind_inputs_for<'a>(
    program: &Program,
    ranks: usize,
    args: &'a Bindings,
    only: Option<usize>,
) -> Result<BoundInputs<'a>, InterpError> {
    let ex = prepare(program, ranks, args)?;
    let mut bound = BoundInputs {
        shapes: program.ids().zip(ex.shapes.iter().cloned()).collect(),
        tensors: Default::default(),
        scalars: Default::default(),
        pieces: Default::default(),
    };
    for id in program.ids() {
        match program.node(id).op {
            Op::TensorInput => {
                bound
                    .tensors
                    .insert(id, ex.bind_tensor_for(id, args, only)?);
                let name = program.label(id);
                match args.tensors[&name].pieces.clone() {
                    Some(Ok(lens)) => {
                        bound.pieces.insert(id, lens);
                    }
                    Some(Err(rank)) => return Err(InterpError::Pieces { name, rank }),
                    None => {}
                }
            }
            Op::ScalarInput => {
                let v = ex.eval(id, args)?;
                let x = v.into_iter().flatten().next().map_or(0.0, |d| d[0]);
                bound.scalars.insert(id, x);
            }
            _ => {}
        }
    }
    Ok(bound)
}

fn check_names(program: &Program, args: &Bindings) -> Result<(), InterpError> {
    let unknown = |name: &str, what| InterpError::Unknown {
        program: program.name().to_string(),
        name: name.to_string(),
        what,
    };
    let is_input = |name: &str, op: Op| {
        program
            .find(name)
            .is_some_and(|id| program.node(id).op == op)
    };
    for name in args.tensors.keys() {
        if !is_input(name, Op::TensorInput) {
            return Err(unknown(name, "tensor input"));
        }
    }
    for name in args.scalars.keys() {
        if !is_input(name, Op::ScalarInput) {
            return Err(unknown(name, "scalar input"));
        }
    }
    let symbols = program.symbols();
    for name in args.dims.keys() {
        if !symbols.contains(name) {
            return Err(unknown(name, "dimension"));
        }
    }
    Ok(())
}

impl Execution {
    /// Number of ranks it ran on.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// The program it ran.
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// Position of a value of the program (the checker guarantees operands exist).
    fn pos(&self, v: ValueId) -> usize {
        self.program
            .position(v)
            .expect("operands belong to the program")
    }

    /// World ranks that hold values placed like `v`.
    fn holders(&self, v: ValueId) -> std::ops::Range<usize> {
        match self.program.node(v).ty.placement {
            Placement::Everywhere => 0..self.ranks,
            Placement::Group(g) => g * self.group_size..(g + 1) * self.group_size,
        }
    }

    /// The shape of `v`'s data on world rank `r`.
    fn local_shape(&self, v: ValueId, r: usize) -> Vec<usize> {
        let mut s = self.shapes[self.pos(v)].clone();
        if let Layout::Sliced(d) = self.program.node(v).ty.layout {
            s[d] = block_range(s[d], self.group_size, r % self.group_size).len();
        }
        s
    }

    fn data(&self, v: ValueId, r: usize) -> &[f64] {
        self.values[self.pos(v)][r]
            .as_deref()
            .expect("checker guarantees operands are held by the same ranks")
    }

    /// `v`'s data on world rank `rank` (`None` if that rank's group does not hold it).
    pub fn local<T: Element>(&self, v: impl Into<ValueId>, rank: usize) -> Option<Vec<T>> {
        let v = v.into();
        self.values
            .get(self.program.position(v)?)?
            .get(rank)?
            .as_ref()
            .map(|d| d.iter().map(|&x| T::from_f64(x)).collect())
    }

    /// The logical value of a Replicated or Sliced value (blocks concatenated). Local
    /// values differ per rank: read them with [`Execution::local`].
    pub fn logical<T: Element>(&self, v: impl Into<ValueId>) -> Result<Vec<T>, InterpError> {
        let v = v.into();
        if !self.program.contains(v) {
            return Err(InterpError::Read(format!(
                "{v} is not a value of `{}`",
                self.program.name()
            )));
        }
        let node = self.program.node(v);
        let ranks = self.holders(v);
        let data = match node.ty.layout {
            Layout::Replicated => self.data(v, ranks.start).to_vec(),
            Layout::Local => {
                return Err(InterpError::Read(format!(
                    "`{}` is Local (a different value per rank); read it per rank",
                    self.program.label(v)
                )));
            }
            Layout::Sliced(d) => {
                let blocks: Vec<(&[f64], usize)> = ranks
                    .map(|r| (self.data(v, r), self.local_shape(v, r)[d]))
                    .collect();
                concat_dim(&blocks, &self.shapes[self.pos(v)], d)
            }
        };
        Ok(data.into_iter().map(T::from_f64).collect())
    }

    /// The logical value of input `name` after the program: its `update` if it has one,
    /// else its original value.
    pub fn final_input<T: Element>(&self, name: &str) -> Result<Vec<T>, InterpError> {
        self.final_value(name, |s, v| s.logical(v))
    }

    /// Rank `rank`'s data of input `name` after the program (for Local inputs).
    pub fn final_input_local<T: Element>(
        &self,
        name: &str,
        rank: usize,
    ) -> Result<Vec<T>, InterpError> {
        self.final_value(name, |s, v| {
            s.local(v, rank)
                .ok_or_else(|| InterpError::Read(format!("rank {rank} does not hold `{name}`")))
        })
    }

    fn final_value<R>(
        &self,
        name: &str,
        read: impl Fn(&Self, ValueId) -> Result<R, InterpError>,
    ) -> Result<R, InterpError> {
        let input = self
            .program
            .find(name)
            .filter(|&id| self.program.node(id).op == Op::TensorInput)
            .ok_or_else(|| InterpError::Read(format!("`{name}` is not a tensor input")))?;
        let v = self
            .program
            .updates()
            .find(|&(t, _)| t == input)
            .map_or(input, |(_, v)| v);
        read(self, v)
    }

    fn scalar(&self, v: ValueId, r: usize) -> f64 {
        self.data(v, r)[0]
    }

    /// Evaluates one node on every rank.
    fn eval(&self, id: ValueId, args: &Bindings) -> Result<Vec<Option<Vec<f64>>>, InterpError> {
        let node = self.program.node(id);
        let q = self.group_size;
        let mut out: Vec<Option<Vec<f64>>> = vec![None; self.ranks];
        let holders = self.holders(id);
        match node.op {
            Op::TensorInput => return self.bind_tensor(id, args),
            Op::ScalarInput => {
                let name = self.program.label(id);
                let &(dtype, x) = args
                    .scalars
                    .get(&name)
                    .ok_or_else(|| InterpError::Missing(name.clone()))?;
                if dtype != node.ty.dtype {
                    return Err(InterpError::DType {
                        name,
                        expected: node.ty.dtype,
                        got: dtype,
                    });
                }
                fill(&mut out, holders, |_| vec![x]);
            }
            Op::Literal(x) => fill(&mut out, holders, |_| vec![x]),
            Op::Unary(op, x) => fill(&mut out, holders, |r| {
                self.pointwise(id, &[x], r, |a| op.eval(a[0]))
            }),
            Op::Binary(op, a, b) => {
                let int = self.program.node(a).ty.dtype.is_int();
                fill(&mut out, holders, |r| {
                    self.pointwise(id, &[a, b], r, |v| op.eval(v[0], v[1], int))
                })
            }
            Op::Select(c, a, b) => fill(&mut out, holders, |r| {
                self.pointwise(id, &[c, a, b], r, |v| if v[0] != 0.0 { v[1] } else { v[2] })
            }),
            Op::Cast(x) => fill(&mut out, holders, |r| self.data(x, r).to_vec()),
            Op::Dropout { x, p, seed } => fill(&mut out, holders, |r| self.dropout(x, p, seed, r)),
            Op::MatMul(a, b) => fill(&mut out, holders, |r| self.matmul(a, b, r)),
            Op::ReduceAll(kind, x) => fill(&mut out, holders, |r| vec![kind.eval(self.data(x, r))]),
            Op::LayerNorm {
                x,
                gamma,
                beta,
                eps,
            } => fill(&mut out, holders, |r| {
                let h = *self.shapes[self.pos(x)].last().expect("rank >= 1");
                let (g, b, e) = (self.data(gamma, r), self.data(beta, r), self.scalar(eps, r));
                let data = self.data(x, r);
                let mut y = vec![0.0; data.len()];
                for (row, out) in data.chunks(h.max(1)).zip(y.chunks_mut(h.max(1))) {
                    crate::numerics::layer_norm_row(row, g, b, e, out);
                }
                y
            }),
            Op::Collective(c, x) => self.collective(id, c, x, &mut out)?,
            Op::Scatter(x, dim) => {
                let shape = &self.shapes[self.pos(x)];
                fill(&mut out, holders, |r| {
                    slice_dim(
                        self.data(x, r),
                        shape,
                        dim,
                        block_range(shape[dim], q, r % q),
                    )
                });
            }
            Op::Update { value, .. } => fill(&mut out, holders, |r| self.data(value, r).to_vec()),
        }
        Ok(out)
    }

    /// Evaluates collective `c` of `x` (node `id`) on the ranks of its group.
    fn collective(
        &self,
        id: ValueId,
        c: Collective,
        x: ValueId,
        out: &mut [Option<Vec<f64>>],
    ) -> Result<(), InterpError> {
        let q = self.group_size;
        let holders = self.holders(id);
        if let Some(root) = c.root() {
            self.check_root(c.name(), id, root)?;
        }
        match c {
            Collective::AllReduce(op) => {
                let reduced = self.reduce_group(op, x, holders.start);
                fill(out, holders, |_| reduced.clone());
            }
            Collective::ReduceScatter(op, dim) => {
                let reduced = self.reduce_group(op, x, holders.start);
                let shape = &self.shapes[self.pos(x)];
                fill(out, holders, |r| {
                    slice_dim(&reduced, shape, dim, block_range(shape[dim], q, r % q))
                });
            }
            Collective::AllGather => {
                let Layout::Sliced(d) = self.program.node(x).ty.layout else {
                    unreachable!("checker: all_gather operand is Sliced")
                };
                let blocks: Vec<(&[f64], usize)> = holders
                    .clone()
                    .map(|r| (self.data(x, r), self.local_shape(x, r)[d]))
                    .collect();
                let full = concat_dim(&blocks, &self.shapes[self.pos(x)], d);
                fill(out, holders, |_| full.clone());
            }
            Collective::Broadcast(root) => {
                let v = self.data(x, holders.start + root).to_vec();
                fill(out, holders, |_| v.clone());
            }
            Collective::Reduce(op, root) => {
                let reduced = self.reduce_group(op, x, holders.start);
                let start = holders.start;
                fill(out, holders, |r| {
                    if r - start == root {
                        reduced.clone()
                    } else {
                        self.data(x, r).to_vec()
                    }
                });
            }
            Collective::Send(dir) => {
                for r in holders {
                    let from = match dir {
                        Direction::Next => r - q,
                        Direction::Prev => r + q,
                    };
                    out[r] = Some(self.data(x, from).to_vec());
                }
            }
        }
        Ok(())
    }

    fn check_root(&self, op: &'static str, id: ValueId, root: usize) -> Result<(), InterpError> {
        if root >= self.group_size {
            return Err(InterpError::Root {
                op,
                value: self.program.label(id),
                root,
                group_size: self.group_size,
            });
        }
        Ok(())
    }

    /// Reduces `x` over the group starting at world rank `start`, in rank order.
    fn reduce_group(&self, op: ReduceOp, x: ValueId, start: usize) -> Vec<f64> {
        let q = self.group_size;
        let mut acc = self.data(x, start).to_vec();
        for r in start + 1..start + q {
            for (a, b) in acc.iter_mut().zip(self.data(x, r)) {
                *a = op.combine(*a, *b);
            }
        }
        acc.into_iter().map(|a| op.finish(a, q)).collect()
    }

    /// Pointwise op on world rank `r`: operands are taken as stored, except that a
    /// Replicated operand spanning the result's sliced dim is sliced to rank r's block.
    fn pointwise(
        &self,
        id: ValueId,
        ops: &[ValueId],
        r: usize,
        f: impl Fn(&[f64]) -> f64,
    ) -> Vec<f64> {
        let ty = &self.program.node(id).ty;
        let out_shape = self.local_shape(id, r);
        let rr = out_shape.len();
        let views: Vec<(std::borrow::Cow<[f64]>, Vec<usize>)> = ops
            .iter()
            .map(|&o| {
                let ot = &self.program.node(o).ty;
                let data = self.data(o, r);
                let mut shape = self.local_shape(o, r);
                if let (Layout::Sliced(rd), Layout::Replicated) = (ty.layout, ot.layout) {
                    let ro = ot.shape.rank();
                    if let Some(od) = (rd + ro).checked_sub(rr)
                        && ot.shape.0[od] != crate::Dim::Const(1)
                    {
                        let range = block_range(shape[od], self.group_size, r % self.group_size);
                        let sliced = slice_dim(data, &shape, od, range.clone());
                        shape[od] = range.len();
                        return (std::borrow::Cow::Owned(sliced), shape);
                    }
                }
                (std::borrow::Cow::Borrowed(data), shape)
            })
            .collect();
        let args: Vec<(&[f64], &[usize])> = views.iter().map(|(d, s)| (&d[..], &s[..])).collect();
        broadcast_map(&out_shape, &args, f)
            .expect("checker guarantees operand shapes broadcast to the result")
    }

    fn matmul(&self, a: ValueId, b: ValueId, r: usize) -> Vec<f64> {
        let (sa, sb) = (self.local_shape(a, r), self.local_shape(b, r));
        let (da, db) = (self.data(a, r), self.data(b, r));
        let (k, n) = (sb[0], sb[1]);
        let m = numel(&sa[..sa.len() - 1]);
        debug_assert_eq!(sa[sa.len() - 1], k);
        let mut out = vec![0.0; m * n];
        for i in 0..m {
            for kk in 0..k {
                let x = da[i * k + kk];
                for j in 0..n {
                    out[i * n + j] += x * db[kk * n + j];
                }
            }
        }
        out
    }

    fn dropout(&self, x: ValueId, p: ValueId, seed: ValueId, r: usize) -> Vec<f64> {
        let p = self.scalar(p, r);
        let seed = self.scalar(seed, r) as i64 as u64;
        let threshold = philox::dropout_threshold(p);
        let scale = 1.0 / (1.0 - p);
        let full = &self.shapes[self.pos(x)];
        let local = self.local_shape(x, r);
        let (dim, offset) = match self.program.node(x).ty.layout {
            Layout::Sliced(d) => (
                d,
                block_range(full[d], self.group_size, r % self.group_size).start,
            ),
            _ => (0, 0),
        };
        let data = self.data(x, r);
        let mut idx = vec![0usize; local.len()];
        let mut out = Vec::with_capacity(data.len());
        for &v in data {
            // Logical index of this element in the whole tensor.
            let mut g = 0usize;
            for k in 0..local.len() {
                let i = if k == dim { idx[k] + offset } else { idx[k] };
                g = g * full[k] + i;
            }
            let keep = philox::dropout_bits(seed, g as u64) as u64 >= threshold;
            out.push(if keep { v * scale } else { 0.0 });
            for k in (0..local.len()).rev() {
                idx[k] += 1;
                if idx[k] < local[k] {
                    break;
                }
                idx[k] = 0;
            }
        }
        out
    }

    fn bind_tensor(
        &self,
        id: ValueId,
        args: &Bindings,
    ) -> Result<Vec<Option<Vec<f64>>>, InterpError> {
        let typed = self.bind_tensor_for(id, args, None)?;
        Ok(typed.into_iter().map(|d| d.map(|d| d.to_f64())).collect())
    }

    /// Lays input `id` out on every rank, or (`only`) on one rank: then the other ranks'
    /// data is neither made nor needed, and a [`TensorArg::ThisRank`] binding is taken.
    fn bind_tensor_for<'a>(
        &self,
        id: ValueId,
        args: &'a Bindings,
        only: Option<usize>,
    ) -> Result<Vec<Option<Cow<'a, HostData>>>, InterpError> {
        let node = self.program.node(id);
        let name = self.program.label(id);
        let b = args
            .tensors
            .get(&name)
            .ok_or_else(|| InterpError::Missing(name.clone()))?;
        if b.dtype != node.ty.dtype {
            return Err(InterpError::DType {
                name,
                expected: node.ty.dtype,
                got: b.dtype,
            });
        }
        let inexact = |data: &HostData| match data {
            HostData::I64(v) => v.iter().find(|x| x.unsigned_abs() > 1 << 53).copied(),
            _ => None,
        };
        let supplied: Vec<&HostData> = match &b.data {
            Supplied::Global(d) | Supplied::ThisRank(d) => vec![d],
            Supplied::PerRank(bufs) => bufs.iter().collect(),
        };
        if let Some(value) = supplied.into_iter().find_map(inexact) {
            return Err(InterpError::InexactI64 { name, value });
        }
        let q = self.group_size;
        let holders = self.holders(id);
        let full = &self.shapes[self.pos(id)];
        let length = |rank: String, shape: &[usize], got: usize| InterpError::Length {
            name: name.clone(),
            rank,
            shape: format!("{shape:?}"),
            expected: numel(shape),
            got,
        };
        let mut out = vec![None; self.ranks];
        let wanted = |r: &usize| only.is_none_or(|o| o == *r);
        match &b.data {
            Supplied::Global(data) => {
                if data.len() != numel(full) {
                    return Err(length(String::new(), full, data.len()));
                }
                for r in holders.filter(wanted) {
                    out[r] = Some(match node.ty.layout {
                        Layout::Sliced(d) => {
                            Cow::Owned(data.slice_dim(full, d, block_range(full[d], q, r % q)))
                        }
                        _ => Cow::Borrowed(data),
                    });
                }
            }
            Supplied::PerRank(bufs) => {
                if bufs.len() != q {
                    return Err(InterpError::RankCount {
                        name,
                        expected: q,
                        got: bufs.len(),
                    });
                }
                for (i, r) in holders.enumerate() {
                    let shape = self.local_shape(id, r);
                    if bufs[i].len() != numel(&shape) {
                        return Err(length(format!(" on rank {i}"), &shape, bufs[i].len()));
                    }
                    if node.ty.layout == Layout::Replicated
                        && bufs[i].as_bytes() != bufs[0].as_bytes()
                    {
                        return Err(InterpError::NotReplicated { name, rank: i });
                    }
                    if wanted(&r) {
                        out[r] = Some(Cow::Borrowed(&bufs[i]));
                    }
                }
            }
            Supplied::ThisRank(data) => {
                let Some(r) = only else {
                    return Err(InterpError::Read(format!(
                        "input `{name}` is bound for one rank only (TensorArg::ThisRank); the \
                         interpreter and in-process backends need every rank's data"
                    )));
                };
                if holders.contains(&r) {
                    let shape = self.local_shape(id, r);
                    if data.len() != numel(&shape) {
                        return Err(length(format!(" on rank {r}"), &shape, data.len()));
                    }
                    out[r] = Some(Cow::Borrowed(data));
                }
            }
        }
        Ok(out)
    }
}

fn fill(
    out: &mut [Option<Vec<f64>>],
    ranks: std::ops::Range<usize>,
    f: impl Fn(usize) -> Vec<f64>,
) {
    for r in ranks {
        out[r] = Some(f(r));
    }
}
