//! Rebuilding a program node by node through the checker, with operands substituted.
//!
//! Every rewriting transformation (split, reorder, as_slice, dead-code elimination) is a
//! pass over the old program in topological order that copies most nodes and replaces a
//! few. Copies go through [`ProgramBuilder`] again, so the new program is re-checked and
//! its layouts re-inferred (a computation fed a Sliced value becomes Sliced), and keep
//! their [`ValueId`] and name, so handles stay valid.

use crate::{CheckError, Op, Placement, Program, ProgramBuilder, ValueId};
use std::collections::HashMap;

/// State of one rebuild: the old program, the new builder and old → new value map.
pub(crate) struct Rewrite<'a> {
    pub from: &'a Program,
    pub b: ProgramBuilder,
    pub map: HashMap<ValueId, ValueId>,
}

impl<'a> Rewrite<'a> {
    pub fn new(from: &'a Program) -> Rewrite<'a> {
        Rewrite {
            from,
            b: ProgramBuilder::derived_from(from),
            map: HashMap::new(),
        }
    }

    /// The new value standing for old value `v`.
    pub fn get(&self, v: ValueId) -> ValueId {
        self.map[&v]
    }

    /// Copies `old` with its operands mapped by `m`, keeping its id and name.
    pub fn copy_with(
        &mut self,
        old: ValueId,
        m: impl Fn(ValueId) -> ValueId,
    ) -> Result<ValueId, CheckError> {
        let new = self.emit_with(old, Some(old), m)?;
        self.map.insert(old, new);
        Ok(new)
    }

    /// Copies `old` unchanged except for operands (through the map).
    pub fn copy(&mut self, old: ValueId) -> Result<ValueId, CheckError> {
        let map = self.map.clone();
        self.copy_with(old, |v| map[&v])
    }

    /// Adds `old`'s operation with operands mapped by `m`; `keep` = the id (and name) to
    /// give it, or `None` for a fresh, unnamed value. Does not touch the map.
    pub fn emit_with(
        &mut self,
        old: ValueId,
        keep: Option<ValueId>,
        m: impl Fn(ValueId) -> ValueId,
    ) -> Result<ValueId, CheckError> {
        let node = self.from.node(old).clone();
        if let Some(id) = keep {
            self.b.reuse_id(id)?;
        }
        let b = &mut self.b;
        let ty = &node.ty;
        let name = || node.name.clone().unwrap_or_else(|| old.to_string());
        let new = match node.op {
            Op::TensorInput => {
                let group = match ty.placement {
                    Placement::Group(g) => g,
                    Placement::Everywhere => 0,
                };
                return b.tensor_input(&name(), ty.dtype, ty.layout, ty.shape.clone(), group);
            }
            Op::ScalarInput => return b.scalar_input(&name(), ty.dtype),
            Op::Literal(x) => b.literal(x, ty.dtype),
            Op::Unary(op, x) => b.unary(op, m(x))?,
            Op::Binary(op, x, y) => b.binary(op, m(x), m(y))?,
            Op::Select(c, x, y) => b.select(m(c), m(x), m(y))?,
            Op::Cast(x) => b.cast(ty.dtype, m(x))?,
            Op::Dropout { x, p, seed } => b.dropout(m(x), m(p), m(seed))?,
            Op::MatMul(x, y) => b.matmul(m(x), m(y))?,
            Op::ReduceAll(k, x) => b.reduce_all(k, m(x))?,
            Op::LayerNorm {
                x,
                gamma,
                beta,
                eps,
            } => b.layer_norm(m(x), m(gamma), m(beta), m(eps))?,
            Op::Collective(c, x) => b.collective(c, m(x))?,
            Op::Scatter(x, d) => b.scatter(m(x), d)?,
            Op::Update { target, value } => b.update(m(target), m(value))?,
        };
        if keep.is_some()
            && let Some(n) = &node.name
        {
            b.bind(new, n)?;
        }
        Ok(new)
    }

    /// The new program; outputs are mapped through the map.
    pub fn finish(mut self) -> Result<Program, CheckError> {
        for &o in self.from.outputs() {
            let new = self.map[&o];
            self.b.output(new)?;
        }
        Ok(self.b.finish())
    }
}

/// Users of every value (in topological order).
pub(crate) fn users(p: &Program) -> HashMap<ValueId, Vec<ValueId>> {
    let mut u: HashMap<ValueId, Vec<ValueId>> = HashMap::new();
    for id in p.ids() {
        for o in p.node(id).op.operands() {
            u.entry(o).or_default().push(id);
        }
    }
    u
}
