//! [`ProgramBuilder`]: builds a [`Program`] one operation at a time and checks every
//! operation against the typing and layout rules as it is added.
//!
//! This is *the* checker: the `#[coconet]` macro drives the same builder at compile time
//! (turning errors into spanned compile errors) and again at run time to construct the
//! program, so programs written either way are checked identically.
//!
//! # Layout rules (see DESIGN.md)
//!
//! | operation | operands | result |
//! |---|---|---|
//! | pointwise (`+ - * /`, `min`, `select`, ...) | R⊕R, L⊕L, R⊕L, S(d)⊕S(d), S(d)⊕R | R, L, L, S(d), S(d) |
//! | | S⊕L | error |
//! | `matmul(a, b)` | R×R / any L / S(row)×R / R×S(1) / S(K)×S(0) | R / L / S(row) / S(last) / L (partial sums) |
//! | `reduce_sum` and friends | R / L / S | R / L / L (partial per rank) |
//! | `all_reduce` | L or R | R |
//! | `reduce_scatter(.., dim)` | L or R | S(dim) |
//! | `all_gather` | S(d) | R |
//! | `broadcast(x, root)` | L or R | R |
//! | `reduce(op, x, root)` | L or R | L (root holds the reduction) |
//! | `scatter(x, dim)` | R | S(dim) |
//! | `send(x, dir)` | any | same layout, neighbouring group |
//!
//! In S(d)⊕R the Replicated operand is sliced only if it spans the sliced dim; an operand
//! broadcast along it (a bias `[H]` against `[B, S, H]` sliced on `B`) is used whole.
//! Literals take the dtype of the expression they appear in; tensors are never promoted.

use crate::{
    Blame, CheckError, DType, ErrorKind, Layout, Op, Placement, Program, ReduceKind, Shape,
    UnaryOp, ValueId, ValueType, op::BinaryOp, program::Node,
};
use std::collections::BTreeSet;

/// An operand of a builder call: a value of the program or a literal constant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Operand {
    /// A value already in the program.
    Value(ValueId),
    /// A constant; it takes the dtype of the expression it appears in.
    Lit(f64),
}

impl From<ValueId> for Operand {
    fn from(v: ValueId) -> Operand {
        Operand::Value(v)
    }
}

impl From<f64> for Operand {
    fn from(x: f64) -> Operand {
        Operand::Lit(x)
    }
}

impl From<i64> for Operand {
    fn from(x: i64) -> Operand {
        Operand::Lit(x as f64)
    }
}

/// Builds and checks a [`Program`].
///
/// ```
/// use coconet_core::*;
/// let mut b = ProgramBuilder::new("sgd");
/// let n = Shape::new(vec![Dim::sym("N")]);
/// let g = b.tensor_input("g", DType::F32, Layout::Local, n.clone(), 0).unwrap();
/// let w = b.tensor_input("w", DType::F32, Layout::Replicated, n, 0).unwrap();
/// let lr = b.scalar_input("lr", DType::F32).unwrap();
/// let g1 = b.all_reduce(ReduceOp::Sum, g).unwrap();
/// let step = b.binary(BinaryOp::Mul, lr, g1).unwrap();
/// let w1 = b.binary(BinaryOp::Sub, w, step).unwrap();
/// let w2 = b.update(w, w1).unwrap();
/// b.bind(w2, "w1").unwrap();
/// // all_gather needs a Sliced operand: the checker says so.
/// let err = b.all_gather(g).unwrap_err();
/// assert!(err.message.contains("Sliced"));
/// let p = b.finish();
/// assert_eq!(p.node(g1).ty.layout, Layout::Replicated);
/// ```
#[derive(Debug, Clone)]
pub struct ProgramBuilder {
    program: Program,
    updated: BTreeSet<ValueId>,
    /// Id for the next value, when a rewrite keeps an old id.
    next_id: Option<ValueId>,
}

pub(crate) fn err(kind: ErrorKind, msg: impl Into<String>) -> CheckError {
    CheckError::new(kind, msg)
}

impl ProgramBuilder {
    /// A builder for a program with one process group (the whole world).
    pub fn new(name: impl Into<String>) -> ProgramBuilder {
        ProgramBuilder {
            program: Program {
                name: name.into(),
                groups: 1,
                nodes: Vec::new(),
                ids: Vec::new(),
                positions: Vec::new(),
                outputs: Vec::new(),
            },
            updated: BTreeSet::new(),
            next_id: None,
        }
    }

    /// A builder for a rewritten version of `from`: fresh ids continue after all of
    /// `from`'s, so ids copied with [`ProgramBuilder::reuse_id`] never collide.
    pub fn derived_from(from: &Program) -> ProgramBuilder {
        let mut b = ProgramBuilder::new(from.name.clone());
        b.program.groups = from.groups;
        b.program.positions = vec![u32::MAX; from.positions.len()];
        b
    }

    /// Gives the next value added the id `id` (used when rewriting a program, to keep
    /// the ids of copied values). The id must not be in use in this builder.
    pub fn reuse_id(&mut self, id: ValueId) -> Result<(), CheckError> {
        if self.program.contains(id) {
            return Err(err(ErrorKind::Binding, format!("{id} is already used")));
        }
        self.next_id = Some(id);
        Ok(())
    }

    /// Splits the world into `groups` equal contiguous groups (pipeline parallelism).
    pub fn set_groups(&mut self, groups: usize) -> Result<(), CheckError> {
        if groups == 0 {
            return Err(err(ErrorKind::Group, "a program needs at least one group"));
        }
        if !self.program.nodes.is_empty() {
            return Err(err(
                ErrorKind::Usage,
                "set_groups must be called before any value is added",
            ));
        }
        self.program.groups = groups;
        Ok(())
    }

    /// The type of a value added so far.
    ///
    /// # Panics
    /// If `v` was not added to this builder.
    pub fn ty(&self, v: ValueId) -> &ValueType {
        &self.program.node(v).ty
    }

    fn node_mut(&mut self, v: ValueId) -> &mut Node {
        let p = self.program.position(v).expect("value of this builder");
        &mut self.program.nodes[p]
    }

    /// The program so far.
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// Finishes the program.
    pub fn finish(self) -> Program {
        self.program
    }

    pub(crate) fn push(&mut self, op: Op, ty: ValueType) -> ValueId {
        let id = self
            .next_id
            .take()
            .unwrap_or(ValueId(self.program.positions.len() as u32));
        let slot = id.0 as usize;
        if slot >= self.program.positions.len() {
            self.program.positions.resize(slot + 1, u32::MAX);
        }
        self.program.positions[slot] = self.program.nodes.len() as u32;
        self.program.nodes.push(Node { op, ty, name: None });
        self.program.ids.push(id);
        id
    }

    pub(crate) fn check_id(&self, v: ValueId) -> Result<(), CheckError> {
        if self.program.contains(v) {
            Ok(())
        } else {
            Err(err(
                ErrorKind::Binding,
                format!("{v} is not a value of program `{}`", self.program.name),
            ))
        }
    }

    fn check_name_free(&self, name: &str) -> Result<(), CheckError> {
        if self.program.find(name).is_some() {
            return Err(err(
                ErrorKind::Binding,
                format!(
                    "`{name}` is already bound; coconet programs bind each name once (use a new name)"
                ),
            ));
        }
        Ok(())
    }

    /// Declares a tensor input held by group `group`.
    pub fn tensor_input(
        &mut self,
        name: &str,
        dtype: DType,
        layout: Layout,
        shape: Shape,
        group: usize,
    ) -> Result<ValueId, CheckError> {
        self.check_name_free(name)?;
        if group >= self.program.groups {
            return Err(err(
                ErrorKind::Group,
                format!(
                    "input `{name}` is placed in group {group}, but the program has {} group(s)",
                    self.program.groups
                ),
            ));
        }
        if let Layout::Sliced(d) = layout
            && d >= shape.rank()
        {
            return Err(err(
                ErrorKind::Layout,
                format!(
                    "input `{name}` is Sliced({d}) but its shape {shape} has only {} dim(s)",
                    shape.rank()
                ),
            ));
        }
        let ty = ValueType {
            dtype,
            layout,
            shape,
            placement: Placement::Group(group),
        };
        let id = self.push(Op::TensorInput, ty);
        self.node_mut(id).name = Some(name.to_string());
        Ok(id)
    }

    /// Declares a scalar input (same value on every rank).
    pub fn scalar_input(&mut self, name: &str, dtype: DType) -> Result<ValueId, CheckError> {
        self.check_name_free(name)?;
        let id = self.push(Op::ScalarInput, scalar_ty(dtype));
        self.node_mut(id).name = Some(name.to_string());
        Ok(id)
    }

    /// Binds a name to a value (`let name = ...`). Each name is bound once.
    pub fn bind(&mut self, v: ValueId, name: &str) -> Result<(), CheckError> {
        self.check_id(v)?;
        self.check_name_free(name)?;
        let node = self.node_mut(v);
        if let Some(old) = &node.name {
            return Err(err(
                ErrorKind::Binding,
                format!("this value is already bound to `{old}`; bind `{name}` to a new value"),
            ));
        }
        node.name = Some(name.to_string());
        Ok(())
    }

    /// Marks a value as an output of the program.
    pub fn output(&mut self, v: ValueId) -> Result<(), CheckError> {
        self.check_id(v)?;
        if !self.program.outputs.contains(&v) {
            self.program.outputs.push(v);
        }
        Ok(())
    }

    /// A literal materialised with the given dtype.
    pub fn literal(&mut self, x: f64, dtype: DType) -> ValueId {
        self.push(Op::Literal(x), scalar_ty(dtype))
    }

    /// Turns operands into values; literals take the dtype of the first value operand
    /// (or `default` if there is none).
    fn resolve(
        &mut self,
        op: &str,
        operands: &[Operand],
        default: Option<DType>,
    ) -> Result<Vec<ValueId>, CheckError> {
        let mut dtype = None;
        for o in operands {
            if let Operand::Value(v) = *o {
                self.check_id(v)?;
                dtype.get_or_insert(self.ty(v).dtype);
            }
        }
        let dtype = match dtype.or(default) {
            Some(d) => d,
            None => {
                return Err(err(
                    ErrorKind::Usage,
                    format!(
                        "`{op}` has only literal operands; compute the constant in Rust instead"
                    ),
                ));
            }
        };
        let mut out = Vec::with_capacity(operands.len());
        for (i, o) in operands.iter().enumerate() {
            out.push(match *o {
                Operand::Value(v) => v,
                Operand::Lit(x) => {
                    check_literal(op, x, dtype).map_err(|e| e.at(i))?;
                    self.literal(x, dtype)
                }
            });
        }
        Ok(out)
    }

    /// Placement of a combination of values.
    fn combine_placement(&self, op: &str, vs: &[ValueId]) -> Result<Placement, CheckError> {
        let mut p = Placement::Everywhere;
        for (i, &v) in vs.iter().enumerate() {
            match (p, self.ty(v).placement) {
                (_, Placement::Everywhere) => {}
                (Placement::Everywhere, q) => p = q,
                (Placement::Group(a), Placement::Group(b)) if a == b => {}
                (Placement::Group(a), Placement::Group(b)) => {
                    return Err(err(
                        ErrorKind::Group,
                        format!(
                            "`{op}` combines values of group {a} and group {b}; move one with `send` first"
                        ),
                    )
                    .at(i));
                }
            }
        }
        Ok(p)
    }

    fn describe(&self, vs: &[ValueId]) -> String {
        vs.iter()
            .map(|&v| format!("`{}`: {}", self.program.label(v), self.ty(v)))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Shape, layout and placement of a pointwise op over `vs` (numpy broadcasting).
    fn pointwise(&self, op: &str, vs: &[ValueId]) -> Result<ValueType, CheckError> {
        let placement = self.combine_placement(op, vs)?;
        let mut shape = Shape::scalar();
        for (i, &v) in vs.iter().enumerate() {
            shape = shape.broadcast(&self.ty(v).shape).map_err(|_| {
                err(
                    ErrorKind::Shape,
                    format!(
                        "shape mismatch in `{op}`: {} do not broadcast (dims must be equal, \
                         symbolic dims by name, or 1)",
                        self.describe(vs)
                    ),
                )
                .at(i)
            })?;
        }
        let rr = shape.rank();
        let mut sliced: Option<(usize, usize)> = None; // (result dim, operand index)
        let mut local: Option<usize> = None;
        for (i, &v) in vs.iter().enumerate() {
            let t = self.ty(v);
            match t.layout {
                Layout::Replicated => {}
                Layout::Local => {
                    local.get_or_insert(i);
                }
                Layout::Sliced(d) => {
                    let rd = d + rr - t.shape.rank();
                    if t.shape.0[d] != shape.0[rd] {
                        return Err(err(
                            ErrorKind::Layout,
                            format!(
                                "layout mismatch in `{op}`: `{}` is Sliced({d}) but is broadcast \
                                 along that dim ({} against {})",
                                self.program.label(v),
                                t.shape.0[d],
                                shape.0[rd]
                            ),
                        )
                        .at(i));
                    }
                    match sliced {
                        None => sliced = Some((rd, i)),
                        Some((od, _)) if od == rd => {}
                        Some((od, j)) => {
                            return Err(err(
                                ErrorKind::Layout,
                                format!(
                                    "layout mismatch in `{op}`: `{}` and `{}` are sliced along \
                                     different dims of the result ({od} and {rd}); all_gather one first",
                                    self.program.label(vs[j]),
                                    self.program.label(v)
                                ),
                            )
                            .at(i));
                        }
                    }
                }
            }
        }
        let layout = match (sliced, local) {
            (Some((_, i)), Some(j)) => {
                return Err(err(
                    ErrorKind::Layout,
                    format!(
                        "layout mismatch in `{op}`: Sliced ⊕ Local is not allowed ({}): a Local \
                         value holds a different whole tensor on each rank; reduce it \
                         (all_reduce / reduce_scatter) first",
                        self.describe(&[vs[i], vs[j]])
                    ),
                )
                .at(j.max(i)));
            }
            (Some((rd, _)), None) => Layout::Sliced(rd),
            (None, Some(_)) => Layout::Local,
            (None, None) => Layout::Replicated,
        };
        Ok(ValueType {
            dtype: self.ty(vs[0]).dtype,
            layout,
            shape,
            placement,
        })
    }

    fn same_dtype(&self, op: &str, vs: &[ValueId]) -> Result<DType, CheckError> {
        let d = self.ty(vs[0]).dtype;
        for (i, &v) in vs.iter().enumerate().skip(1) {
            if self.ty(v).dtype != d {
                return Err(err(
                    ErrorKind::DType,
                    format!(
                        "dtype mismatch in `{op}`: {}; coconet never promotes implicitly, use \
                         `cast::<T>(x)`",
                        self.describe(vs)
                    ),
                )
                .at(i));
            }
        }
        Ok(d)
    }

    pub(crate) fn require(
        &self,
        op: &str,
        v: ValueId,
        i: usize,
        ok: fn(DType) -> bool,
        what: &str,
    ) -> Result<(), CheckError> {
        let d = self.ty(v).dtype;
        if ok(d) {
            Ok(())
        } else {
            Err(err(
                ErrorKind::DType,
                format!(
                    "`{op}` needs {what} operands, but `{}` is {d}",
                    self.program.label(v)
                ),
            )
            .at(i))
        }
    }

    fn require_scalar(&self, op: &str, v: ValueId, i: usize, what: &str) -> Result<(), CheckError> {
        let t = self.ty(v);
        if !t.is_scalar() || t.layout != Layout::Replicated {
            return Err(err(
                ErrorKind::Usage,
                format!(
                    "the {what} of `{op}` must be a Replicated scalar, but `{}` is {t}",
                    self.program.label(v)
                ),
            )
            .at(i));
        }
        Ok(())
    }

    /// Elementwise unary op.
    pub fn unary(&mut self, op: UnaryOp, x: impl Into<Operand>) -> Result<ValueId, CheckError> {
        let v = self.resolve(op.name(), &[x.into()], None)?;
        if op.float_only() {
            self.require(op.name(), v[0], 0, DType::is_float, "floating-point")?;
        } else {
            self.require(op.name(), v[0], 0, DType::is_numeric, "numeric")?;
        }
        let ty = self.pointwise(op.name(), &v)?;
        Ok(self.push(Op::Unary(op, v[0]), ty))
    }

    /// Elementwise binary op (arithmetic or comparison) with numpy broadcasting.
    pub fn binary(
        &mut self,
        op: BinaryOp,
        a: impl Into<Operand>,
        b: impl Into<Operand>,
    ) -> Result<ValueId, CheckError> {
        let v = self.resolve(op.name(), &[a.into(), b.into()], None)?;
        self.same_dtype(op.name(), &v)?;
        for (i, &x) in v.iter().enumerate() {
            self.require(op.name(), x, i, DType::is_numeric, "numeric")?;
        }
        if op == BinaryOp::Pow {
            self.require(op.name(), v[0], 0, DType::is_float, "floating-point")?;
        }
        let mut ty = self.pointwise(op.name(), &v)?;
        if op.is_comparison() {
            ty.dtype = DType::Bool;
        }
        Ok(self.push(Op::Binary(op, v[0], v[1]), ty))
    }

    /// `select(cond, a, b)`: `a` where the bool mask `cond` is true, else `b`.
    pub fn select(
        &mut self,
        cond: impl Into<Operand>,
        a: impl Into<Operand>,
        b: impl Into<Operand>,
    ) -> Result<ValueId, CheckError> {
        let (a, b) = (a.into(), b.into());
        let c = self.resolve("select", &[cond.into()], Some(DType::Bool))?[0];
        let ab = self.resolve("select", &[a, b], None)?;
        if self.ty(c).dtype != DType::Bool {
            return Err(err(
                ErrorKind::DType,
                format!(
                    "the condition of `select` must be a bool mask, but `{}` is {}",
                    self.program.label(c),
                    self.ty(c).dtype
                ),
            )
            .at(0));
        }
        self.same_dtype("select", &ab).map_err(|e| e.at(2))?;
        let mut ty = self.pointwise("select", &[c, ab[0], ab[1]])?;
        ty.dtype = self.ty(ab[0]).dtype;
        Ok(self.push(Op::Select(c, ab[0], ab[1]), ty))
    }

    /// Conversion to `dtype` (the only way to change a dtype).
    pub fn cast(&mut self, dtype: DType, x: impl Into<Operand>) -> Result<ValueId, CheckError> {
        let x = self.resolve("cast", &[x.into()], Some(dtype))?[0];
        let mut ty = self.ty(x).clone();
        ty.dtype = dtype;
        Ok(self.push(Op::Cast(x), ty))
    }

    /// Inverted dropout with drop probability `p` and RNG `seed` (both Replicated scalars).
    pub fn dropout(
        &mut self,
        x: impl Into<Operand>,
        p: impl Into<Operand>,
        seed: impl Into<Operand>,
    ) -> Result<ValueId, CheckError> {
        let x = self.resolve("dropout", &[x.into()], None)?[0];
        self.require("dropout", x, 0, DType::is_float, "floating-point")?;
        let xd = self.ty(x).dtype;
        let p = self.resolve("dropout", &[p.into()], Some(xd))?[0];
        let seed = self.resolve("dropout", &[seed.into()], Some(DType::I64))?[0];
        self.require_scalar("dropout", p, 1, "probability")?;
        self.require(
            "dropout",
            p,
            1,
            DType::is_float,
            "a floating-point probability as",
        )?;
        self.require_scalar("dropout", seed, 2, "seed")?;
        self.require("dropout", seed, 2, DType::is_int, "an integer seed as")?;
        if let Op::Literal(pv) = self.program.node(p).op
            && !(0.0..1.0).contains(&pv)
        {
            return Err(err(
                ErrorKind::Usage,
                format!("dropout probability must be in [0, 1), got {pv}"),
            )
            .at(1));
        }
        let ty = self.ty(x).clone();
        Ok(self.push(Op::Dropout { x, p, seed }, ty))
    }

    /// Batched matmul `a[.., M, K] × b[K, N]`.
    pub fn matmul(
        &mut self,
        a: impl Into<Operand>,
        b: impl Into<Operand>,
    ) -> Result<ValueId, CheckError> {
        let v = self.resolve("matmul", &[a.into(), b.into()], None)?;
        let (a, b) = (v[0], v[1]);
        self.same_dtype("matmul", &v)?;
        self.require("matmul", a, 0, DType::is_numeric, "numeric")?;
        let placement = self.combine_placement("matmul", &v)?;
        let (ta, tb) = (self.ty(a).clone(), self.ty(b).clone());
        let ra = ta.shape.rank();
        if ra < 2 {
            return Err(err(
                ErrorKind::Shape,
                format!(
                    "`matmul` needs a left operand of shape [.., M, K], got {}",
                    ta.shape
                ),
            )
            .at(0));
        }
        if tb.shape.rank() != 2 {
            return Err(err(
                ErrorKind::Shape,
                format!(
                    "`matmul` needs a right operand of shape [K, N], got {}",
                    tb.shape
                ),
            )
            .at(1));
        }
        if ta.shape.0[ra - 1] != tb.shape.0[0] {
            return Err(err(
                ErrorKind::Shape,
                format!(
                    "shape mismatch in `matmul`: inner dims differ ({} × {})",
                    ta.shape, tb.shape
                ),
            )
            .at(1));
        }
        use Layout::*;
        let layout = match (ta.layout, tb.layout) {
            (Replicated, Replicated) => Replicated,
            (Local, Replicated | Local) | (Replicated, Local) => Local,
            (Sliced(d), Replicated) if d < ra - 1 => Sliced(d),
            (Replicated, Sliced(1)) => Sliced(ra - 1),
            (Sliced(d), Sliced(0)) if d == ra - 1 => Local,
            (la, lb) => {
                return Err(err(
                    ErrorKind::Layout,
                    format!(
                        "layout mismatch in `matmul`: {la} × {lb} is not supported (allowed: \
                         R×R, L×R, R×L, L×L, Sliced(row)×R, R×Sliced(1), Sliced(K)×Sliced(0) → \
                         Local partial sums)"
                    ),
                ));
            }
        };
        let mut dims = ta.shape.0[..ra - 1].to_vec();
        dims.push(tb.shape.0[1].clone());
        let ty = ValueType {
            dtype: ta.dtype,
            layout,
            shape: Shape(dims),
            placement,
        };
        Ok(self.push(Op::MatMul(a, b), ty))
    }

    /// Full reduction to a scalar; of a Sliced tensor it is a Local partial value per rank.
    pub fn reduce_all(
        &mut self,
        kind: ReduceKind,
        x: impl Into<Operand>,
    ) -> Result<ValueId, CheckError> {
        let x = self.resolve(kind.name(), &[x.into()], None)?[0];
        if kind == ReduceKind::Norm2 {
            self.require(kind.name(), x, 0, DType::is_float, "floating-point")?;
        } else {
            self.require(kind.name(), x, 0, DType::is_numeric, "numeric")?;
        }
        let t = self.ty(x).clone();
        let layout = match t.layout {
            Layout::Replicated => Layout::Replicated,
            Layout::Local | Layout::Sliced(_) => Layout::Local,
        };
        let ty = ValueType {
            dtype: t.dtype,
            layout,
            shape: Shape::scalar(),
            placement: t.placement,
        };
        Ok(self.push(Op::ReduceAll(kind, x), ty))
    }

    /// Layer normalisation of `x[.., H]` over its last dim with `gamma[H]`, `beta[H]`.
    pub fn layer_norm(
        &mut self,
        x: impl Into<Operand>,
        gamma: impl Into<Operand>,
        beta: impl Into<Operand>,
        eps: impl Into<Operand>,
    ) -> Result<ValueId, CheckError> {
        let v = self.resolve("layer_norm", &[x.into(), gamma.into(), beta.into()], None)?;
        let (x, gamma, beta) = (v[0], v[1], v[2]);
        self.require("layer_norm", x, 0, DType::is_float, "floating-point")?;
        self.same_dtype("layer_norm", &v)?;
        let eps = self.resolve("layer_norm", &[eps.into()], Some(self.ty(x).dtype))?[0];
        self.require_scalar("layer_norm", eps, 3, "epsilon")?;
        self.same_dtype("layer_norm", &[x, eps])
            .map_err(|e| e.at(3))?;
        let placement = self.combine_placement("layer_norm", &v)?;
        let t = self.ty(x).clone();
        let r = t.shape.rank();
        if r == 0 {
            return Err(err(ErrorKind::Shape, "`layer_norm` of a scalar").at(0));
        }
        if t.layout == Layout::Sliced(r - 1) {
            return Err(err(
                ErrorKind::Layout,
                format!(
                    "`layer_norm` normalises over the last dim, but `{}` is Sliced({}) along it; \
                     all_gather it first",
                    self.program.label(x),
                    r - 1
                ),
            )
            .at(0));
        }
        let h = Shape(vec![t.shape.0[r - 1].clone()]);
        for (i, p) in [(1, gamma), (2, beta)] {
            let tp = self.ty(p);
            if tp.shape != h {
                return Err(err(
                    ErrorKind::Shape,
                    format!(
                        "shape mismatch in `layer_norm`: `{}` must have shape {h}, got {}",
                        self.program.label(p),
                        tp.shape
                    ),
                )
                .at(i));
            }
            if tp.layout != Layout::Replicated {
                return Err(err(
                    ErrorKind::Layout,
                    format!(
                        "`layer_norm` parameters must be Replicated, but `{}` is {}",
                        self.program.label(p),
                        tp.layout
                    ),
                )
                .at(i));
            }
        }
        let ty = ValueType { placement, ..t };
        Ok(self.push(
            Op::LayerNorm {
                x,
                gamma,
                beta,
                eps,
            },
            ty,
        ))
    }

    pub(crate) fn check_dim(
        &self,
        op: &str,
        t: &ValueType,
        dim: usize,
        i: usize,
    ) -> Result<(), CheckError> {
        if dim >= t.shape.rank() {
            return Err(err(
                ErrorKind::Shape,
                format!(
                    "`{op}` along dim {dim}, but the operand has shape {} ({} dims)",
                    t.shape,
                    t.shape.rank()
                ),
            )
            .at(i));
        }
        Ok(())
    }

    /// Takes my block along `dim` of a Replicated value, without communication.
    pub fn scatter(&mut self, x: ValueId, dim: usize) -> Result<ValueId, CheckError> {
        self.check_id(x)?;
        let mut t = self.ty(x).clone();
        if t.layout != Layout::Replicated {
            return Err(err(
                ErrorKind::Layout,
                format!(
                    "layout mismatch: `scatter` takes a slice of a Replicated value, but `{}` is {}",
                    self.program.label(x),
                    t.layout
                ),
            )
            .at(0));
        }
        self.check_dim("scatter", &t, dim, 1)?;
        if t.placement == Placement::Everywhere {
            t.placement = Placement::Group(0);
        }
        t.layout = Layout::Sliced(dim);
        Ok(self.push(Op::Scatter(x, dim), t))
    }

    /// Writes `value` into the tensor input `target` in place; returns the new value.
    pub fn update(
        &mut self,
        target: ValueId,
        value: impl Into<Operand>,
    ) -> Result<ValueId, CheckError> {
        self.check_id(target)?;
        let tname = self.program.label(target);
        if self.program.node(target).op != Op::TensorInput {
            return Err(err(
                ErrorKind::Update,
                format!(
                    "`update` of `{tname}`, which is not a tensor input of the program; only \
                     inputs can be updated in place"
                ),
            )
            .at(0));
        }
        if self.updated.contains(&target) {
            return Err(err(
                ErrorKind::Update,
                format!("input `{tname}` is updated twice; combine the updates into one"),
            )
            .at(0));
        }
        let tt = self.ty(target).clone();
        let value = self.resolve("update", &[value.into()], Some(tt.dtype))?[0];
        let tv = self.ty(value).clone();
        if tv.dtype != tt.dtype {
            return Err(err(
                ErrorKind::DType,
                format!(
                    "dtype mismatch in `update`: `{tname}` is {} but the new value is {}; use \
                     `cast::<{}>(..)`",
                    tt.dtype, tv.dtype, tt.dtype
                ),
            )
            .at(1));
        }
        if tv.shape != tt.shape {
            return Err(err(
                ErrorKind::Shape,
                format!(
                    "shape mismatch in `update`: `{tname}` has shape {} but the new value has {}",
                    tt.shape, tv.shape
                ),
            )
            .at(1));
        }
        if tv.layout != tt.layout {
            return Err(err(
                ErrorKind::Layout,
                format!(
                    "layout mismatch in `update`: `{tname}` is {} but the new value is {}; \
                     communication is never implicit{}",
                    tt.layout,
                    tv.layout,
                    match (tt.layout, tv.layout) {
                        (Layout::Replicated, Layout::Sliced(_)) => " (all_gather the value first)",
                        (Layout::Replicated, Layout::Local) => " (all_reduce the value first)",
                        (Layout::Sliced(_), Layout::Replicated) => " (scatter the value first)",
                        _ => "",
                    }
                ),
            )
            .at(1));
        }
        if tv.placement != tt.placement && tv.placement != Placement::Everywhere {
            return Err(err(
                ErrorKind::Group,
                format!(
                    "`update` of `{tname}` ({}) with a value of {}",
                    tt.placement, tv.placement
                ),
            )
            .at(1));
        }
        self.updated.insert(target);
        Ok(self.push(Op::Update { target, value }, tt))
    }
}

fn scalar_ty(dtype: DType) -> ValueType {
    ValueType {
        dtype,
        layout: Layout::Replicated,
        shape: Shape::scalar(),
        placement: Placement::Everywhere,
    }
}

impl Blame {
    /// The operand index, if the error is about one operand.
    pub fn operand(self) -> Option<usize> {
        match self {
            Blame::Op => None,
            Blame::Operand(i) => Some(i),
        }
    }
}

/// A literal takes the dtype of the expression it is in; it must be a value of that
/// dtype (near enough for floats): a fraction in an integer expression, or a non-zero
/// literal that rounds to 0 or overflows to infinity in the dtype, would silently be
/// another number than the one written.
fn check_literal(op: &str, x: f64, dtype: DType) -> Result<(), CheckError> {
    // As written in the source, near enough: `1e-8` rather than `0.00000001`.
    let shown = if x != 0.0 && !(1e-4..1e7).contains(&x.abs()) {
        format!("{x:e}")
    } else {
        format!("{x}")
    };
    let bad = |why: String| {
        Err(err(
            ErrorKind::DType,
            format!(
                "literal `{shown}` in `{op}` {why}; write a value of the expression's dtype, or cast"
            ),
        ))
    };
    match dtype {
        DType::I32 | DType::I64 => {
            let (lo, hi) = match dtype {
                DType::I32 => (i32::MIN as f64, i32::MAX as f64),
                _ => (i64::MIN as f64, i64::MAX as f64),
            };
            if !x.is_finite() || x.fract() != 0.0 {
                return bad(format!("is not an integer, but the expression is {dtype}"));
            }
            if x < lo || x > hi {
                return bad(format!("does not fit in {dtype}"));
            }
        }
        DType::Bool if x != 0.0 && x != 1.0 => {
            return bad("is not 0 or 1, but the expression is bool".to_string());
        }
        DType::F16 | DType::BF16 | DType::F32 => {
            let r = dtype.round(x);
            if x != 0.0 && x.is_finite() && r == 0.0 {
                return bad(format!("rounds to 0 in {dtype}"));
            }
            if x.is_finite() && r.is_infinite() {
                return bad(format!("overflows to infinity in {dtype}"));
            }
        }
        _ => {}
    }
    Ok(())
}
