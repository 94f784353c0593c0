//! Printing: a readable text form of a [`Program`] (its `Display`) and Graphviz dot export.

use crate::{Op, Program, ValueId};
use std::fmt::{self, Write};

impl Program {
    /// The arguments of `id`'s op as printed (`Sum, g1`, `x, root=0`).
    fn args(&self, id: ValueId) -> String {
        let node = self.node(id);
        let l = |v: &ValueId| self.operand_label(*v);
        let list = |vs: &[ValueId]| vs.iter().map(l).collect::<Vec<_>>().join(", ");
        match &node.op {
            Op::TensorInput | Op::ScalarInput => String::new(),
            Op::Literal(x) => format!("{x:?}"),
            Op::AllReduce(op, x) => format!("{op}, {}", l(x)),
            Op::ReduceScatter(op, x, d) => format!("{op}, {}, dim={d}", l(x)),
            Op::Broadcast(x, root) => format!("{}, root={root}", l(x)),
            Op::Reduce(op, x, root) => format!("{op}, {}, root={root}", l(x)),
            Op::Scatter(x, d) => format!("{}, dim={d}", l(x)),
            Op::Send(x, dir) => format!("{}, {}", l(x), dir.name()),
            op => list(&op.operands()),
        }
    }

    /// Literals print as their value, other values by label.
    fn operand_label(&self, v: ValueId) -> String {
        match self.node(v).op {
            Op::Literal(x) => format!("{x:?}"),
            _ => self.label(v),
        }
    }
}

/// One line per input and per stage, with dtype, layout and shape:
///
/// ```text
/// program sgd (1 group)
///   input  g: f32 Local [N]
///   scalar lr: f32
///   g1 = all_reduce(Sum, g) : f32 Replicated [N]
/// ```
impl fmt::Display for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "program {} ({} group{})",
            self.name,
            self.groups,
            if self.groups == 1 { "" } else { "s" }
        )?;
        for id in self.ids() {
            let node = self.node(id);
            match node.op {
                Op::Literal(_) => continue,
                Op::TensorInput => writeln!(f, "  input  {}: {}", self.label(id), node.ty)?,
                Op::ScalarInput => writeln!(f, "  scalar {}: {}", self.label(id), node.ty.dtype)?,
                _ => writeln!(
                    f,
                    "  {} = {}({}) : {}",
                    self.label(id),
                    node.op.name(),
                    self.args(id),
                    node.ty
                )?,
            }
        }
        if !self.outputs.is_empty() {
            let outs: Vec<_> = self.outputs.iter().map(|&o| self.label(o)).collect();
            writeln!(f, "  return {}", outs.join(", "))?;
        }
        Ok(())
    }
}

/// Graphviz dot of the program: inputs as boxes, communication as bold ellipses, labels
/// with dtype/layout/shape; literals are folded into their users' labels.
pub fn to_dot(p: &Program) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "digraph \"{}\" {{", p.name());
    let _ = writeln!(s, "  rankdir=TB;");
    for id in p.ids() {
        let node = p.node(id);
        if matches!(node.op, Op::Literal(_)) {
            continue;
        }
        let (shape, style) = match node.op {
            Op::TensorInput | Op::ScalarInput => ("box", ""),
            ref op if op.is_communication() => ("ellipse", ", style=bold, color=blue"),
            _ => ("ellipse", ""),
        };
        let title = match node.op {
            Op::TensorInput | Op::ScalarInput => p.label(id),
            ref op => format!("{} = {}({})", p.label(id), op.name(), p.args(id)),
        };
        let _ = writeln!(
            s,
            "  n{} [shape={shape}{style}, label=\"{}\\n{}\"];",
            id.0,
            title.replace('"', "\\\""),
            node.ty
        );
        for o in node.op.operands() {
            if !matches!(p.node(o).op, Op::Literal(_)) {
                let _ = writeln!(s, "  n{} -> n{};", o.0, id.0);
            }
        }
    }
    s.push_str("}\n");
    s
}
