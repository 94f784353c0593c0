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
            Op::Collective(c, x) => c.print_args(&l(x)),
            Op::Scatter(x, d) => format!("{}, dim={d}", l(x)),
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

impl Program {
    /// The printed line of one value (`None` for literals, which print inline).
    pub(crate) fn stage_line(&self, id: ValueId) -> Option<String> {
        let node = self.node(id);
        Some(match node.op {
            Op::Literal(_) => return None,
            Op::TensorInput => format!("input  {}: {}", self.label(id), node.ty),
            Op::ScalarInput => format!("scalar {}: {}", self.label(id), node.ty.dtype),
            _ => format!(
                "{} = {}({}) : {}",
                self.label(id),
                node.op.name(),
                self.args(id),
                node.ty
            ),
        })
    }

    /// The program's header line.
    pub(crate) fn header(&self) -> String {
        format!(
            "program {} ({} group{})",
            self.name,
            self.groups,
            if self.groups == 1 { "" } else { "s" }
        )
    }

    /// The `return` line, if the program returns values.
    pub(crate) fn return_line(&self) -> Option<String> {
        (!self.outputs.is_empty()).then(|| {
            let outs: Vec<_> = self.outputs.iter().map(|&o| self.label(o)).collect();
            format!("return {}", outs.join(", "))
        })
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
        writeln!(f, "{}", self.header())?;
        for line in self.ids().filter_map(|id| self.stage_line(id)) {
            writeln!(f, "  {line}")?;
        }
        if let Some(r) = self.return_line() {
            writeln!(f, "  {r}")?;
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
    dot_body(p, &mut s);
    s.push_str("}\n");
    s
}

/// Nodes and edges of `p` (no header), for [`to_dot`] and schedules.
pub(crate) fn dot_body(p: &Program, s: &mut String) {
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
}
