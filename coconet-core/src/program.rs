//! The typed dataflow graph produced by the checker: a [`Program`] is a list of nodes in
//! topological order, each with its checked [`ValueType`].

use crate::{Collective, DType, Layout, ReduceKind, Shape, UnaryOp, op::BinaryOp};
use std::fmt;

/// Identity of a value in a [`Program`].
///
/// Ids are stable under transformations: a schedule that rewrites the program keeps the
/// ids of the values it copies, so a handle such as `p.g1` stays valid on every schedule
/// derived from `p`'s program (new values get new ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u32);

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

/// Where a value lives among pipeline groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Placement {
    /// Held by every rank of every group: scalar inputs and literals.
    Everywhere,
    /// Held by the ranks of one group; collectives act within it.
    Group(usize),
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Placement::Everywhere => f.write_str("all groups"),
            Placement::Group(g) => write!(f, "group {g}"),
        }
    }
}

/// The checked type of a value: element type, layout, logical shape and placement.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ValueType {
    /// Element type.
    pub dtype: DType,
    /// Storage layout across the ranks of its group.
    pub layout: Layout,
    /// Logical (global) shape; empty for scalars.
    pub shape: Shape,
    /// Which group holds the value.
    pub placement: Placement,
}

impl ValueType {
    /// Whether the value is a scalar.
    pub fn is_scalar(&self) -> bool {
        self.shape.is_scalar()
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {}", self.dtype, self.layout, self.shape)?;
        if let Placement::Group(g) = self.placement
            && g > 0
        {
            write!(f, " @group{g}")?;
        }
        Ok(())
    }
}

/// What a node computes.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// A tensor the caller binds at run time.
    TensorInput,
    /// A scalar the caller binds at run time (learning rate, step, seed...).
    ScalarInput,
    /// A constant; its dtype is taken from the expression it appears in.
    Literal(f64),
    /// Elementwise unary op.
    Unary(UnaryOp, ValueId),
    /// Elementwise binary op with numpy broadcasting.
    Binary(BinaryOp, ValueId, ValueId),
    /// `select(cond, a, b)`: `a` where `cond` is true, else `b`.
    Select(ValueId, ValueId, ValueId),
    /// Conversion to the node's dtype.
    Cast(ValueId),
    /// Inverted dropout: keep with probability `1 - p`, scale kept values by `1/(1-p)`.
    /// The mask is Philox-4x32-10 of (seed, logical element index).
    Dropout {
        /// Input.
        x: ValueId,
        /// Drop probability (scalar).
        p: ValueId,
        /// RNG seed (integer scalar).
        seed: ValueId,
    },
    /// Batched matmul `[.., M, K] × [K, N]`.
    MatMul(ValueId, ValueId),
    /// Full reduction to a scalar (partial per rank for a Sliced input).
    ReduceAll(ReduceKind, ValueId),
    /// Layer normalisation over the last dim: `(x - mean) / sqrt(var + eps) * gamma + beta`.
    LayerNorm {
        /// Input `[.., H]`.
        x: ValueId,
        /// Scale `[H]`.
        gamma: ValueId,
        /// Shift `[H]`.
        beta: ValueId,
        /// Variance epsilon (scalar).
        eps: ValueId,
    },
    /// A collective of the value (see [`Collective`]).
    Collective(Collective, ValueId),
    /// Take my block along `dim` of a Replicated value (no communication).
    Scatter(ValueId, usize),
    /// Writes the value into program input `target` in place (the node's value is the
    /// new value). Reads of the input anywhere in the program see its original value.
    Update {
        /// The program input being written.
        target: ValueId,
        /// The new value.
        value: ValueId,
    },
}

impl Op {
    /// Whether the result is its operands' exact result correctly rounded (`+ - * /`,
    /// sqrt, min, max, negation, abs, relu, select, cast, update). Such an operation
    /// may run in any binary format with at least 2p + 2 bits for a result of p bits and
    /// then be rounded, with the same bits as the interpreter's f64-then-round: f32 for
    /// f32, f16 and bf16 results, which backends use for twice the SIMD width.
    pub fn is_exactly_rounded(&self) -> bool {
        use crate::{BinaryOp as B, UnaryOp as U};
        match self {
            Op::Unary(u, _) => matches!(u, U::Neg | U::Abs | U::Sqrt | U::Relu),
            Op::Binary(b, ..) => {
                matches!(b, B::Add | B::Sub | B::Mul | B::Div | B::Min | B::Max)
            }
            Op::Select(..) | Op::Cast(_) | Op::Update { .. } => true,
            _ => false,
        }
    }

    /// The values this node reads.
    pub fn operands(&self) -> Vec<ValueId> {
        match *self {
            Op::TensorInput | Op::ScalarInput | Op::Literal(_) => vec![],
            Op::Unary(_, x)
            | Op::Cast(x)
            | Op::ReduceAll(_, x)
            | Op::Collective(_, x)
            | Op::Scatter(x, _) => vec![x],
            Op::Binary(_, a, b) | Op::MatMul(a, b) => vec![a, b],
            Op::Update { target, value } => vec![target, value],
            Op::Select(c, a, b) => vec![c, a, b],
            Op::Dropout { x, p, seed } => vec![x, p, seed],
            Op::LayerNorm {
                x,
                gamma,
                beta,
                eps,
            } => vec![x, gamma, beta, eps],
        }
    }

    /// The collective and its operand, if the op is one.
    pub fn collective(&self) -> Option<(Collective, ValueId)> {
        match *self {
            Op::Collective(c, x) => Some((c, x)),
            _ => None,
        }
    }

    /// Whether the op communicates between ranks.
    pub fn is_communication(&self) -> bool {
        matches!(self, Op::Collective(..))
    }

    /// The op's name as printed (`all_reduce`, `add`, `matmul`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            Op::TensorInput => "input",
            Op::ScalarInput => "scalar",
            Op::Literal(_) => "literal",
            Op::Unary(u, _) => u.name(),
            Op::Binary(b, ..) => b.name(),
            Op::Select(..) => "select",
            Op::Cast(_) => "cast",
            Op::Dropout { .. } => "dropout",
            Op::MatMul(..) => "matmul",
            Op::ReduceAll(k, _) => k.name(),
            Op::LayerNorm { .. } => "layer_norm",
            Op::Collective(c, _) => c.name(),
            Op::Scatter(..) => "scatter",
            Op::Update { .. } => "update",
        }
    }
}

/// One value of the graph.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// What it computes.
    pub op: Op,
    /// Its checked type.
    pub ty: ValueType,
    /// The name it was bound to (`let m1 = ...`, or the input's name), if any.
    pub name: Option<String>,
}

/// A checked program: nodes in topological order (operands always precede their users).
///
/// Built by [`crate::ProgramBuilder`] (directly, or by the `#[coconet]` macro).
#[derive(Debug, Clone, PartialEq)]
pub struct Program {
    pub(crate) name: String,
    pub(crate) groups: usize,
    /// Nodes in topological order.
    pub(crate) nodes: Vec<Node>,
    /// The id of the node at each position.
    pub(crate) ids: Vec<ValueId>,
    /// The position of each id (`u32::MAX` for ids not in this program).
    pub(crate) positions: Vec<u32>,
    pub(crate) outputs: Vec<ValueId>,
}

impl Program {
    /// The program's name (the function name for `#[coconet]` programs).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Number of equal contiguous process groups the world is split into.
    pub fn groups(&self) -> usize {
        self.groups
    }

    /// Ranks per group when the program runs on `ranks` ranks, or why it cannot.
    pub fn group_size(&self, ranks: usize) -> Result<usize, crate::InterpError> {
        if ranks == 0 || !ranks.is_multiple_of(self.groups) {
            return Err(crate::InterpError::Ranks {
                program: self.name.clone(),
                ranks,
                groups: self.groups,
            });
        }
        Ok(ranks / self.groups)
    }

    /// All nodes, in topological order (ids: [`Program::ids`]).
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Position of a value in topological order, if it belongs to this program.
    pub fn position(&self, id: ValueId) -> Option<usize> {
        match self.positions.get(id.0 as usize) {
            Some(&p) if p != u32::MAX => Some(p as usize),
            _ => None,
        }
    }

    /// Whether `id` is a value of this program.
    pub fn contains(&self, id: ValueId) -> bool {
        self.position(id).is_some()
    }

    /// One node.
    ///
    /// # Panics
    /// If `id` is not a value of this program (use [`Program::get`] to check).
    pub fn node(&self, id: ValueId) -> &Node {
        self.get(id)
            .unwrap_or_else(|| panic!("{id} is not a value of program `{}`", self.name))
    }

    /// One node, if `id` belongs to this program.
    pub fn get(&self, id: ValueId) -> Option<&Node> {
        self.position(id).map(|p| &self.nodes[p])
    }

    /// The smallest id not used by this program or any program it was derived from.
    pub fn next_id(&self) -> u32 {
        self.positions.len() as u32
    }

    /// The values returned by the program (besides the updated inputs).
    pub fn outputs(&self) -> &[ValueId] {
        &self.outputs
    }

    /// Ids of the tensor and scalar inputs, in declaration order.
    pub fn inputs(&self) -> impl Iterator<Item = ValueId> + '_ {
        self.ids()
            .filter(|&id| matches!(self.node(id).op, Op::TensorInput | Op::ScalarInput))
    }

    /// `(input, new value)` for every `update` in the program.
    pub fn updates(&self) -> impl Iterator<Item = (ValueId, ValueId)> + '_ {
        self.ids().filter_map(|id| match self.node(id).op {
            Op::Update { target, .. } => Some((target, id)),
            _ => None,
        })
    }

    /// All value ids in topological order.
    pub fn ids(&self) -> impl Iterator<Item = ValueId> + '_ {
        self.ids.iter().copied()
    }

    /// Looks a value up by the name it was bound to.
    pub fn find(&self, name: &str) -> Option<ValueId> {
        self.ids()
            .find(|&id| self.node(id).name.as_deref() == Some(name))
    }

    /// The symbolic dimension names used anywhere in the program, sorted.
    pub fn symbols(&self) -> Vec<String> {
        let mut s: Vec<String> = self
            .nodes
            .iter()
            .flat_map(|n| n.ty.shape.symbols().map(str::to_string))
            .collect();
        s.sort();
        s.dedup();
        s
    }

    /// A readable name for a value: its binding name or `%i`.
    pub fn label(&self, id: ValueId) -> String {
        match &self.node(id).name {
            Some(n) => n.clone(),
            None => id.to_string(),
        }
    }
}
