//! Printing a schedule: its steps, the program with each stage's fusion group, the fusion
//! groups and overlap pairs; and Graphviz with fusion groups as clusters.

use super::fusion::FusionKind;
use super::scheduled::Schedule;
use crate::print::dot_body;
use std::fmt::{self, Write};

impl Schedule {
    fn fusion_title(&self, g: usize) -> String {
        let f = &self.fusions[g];
        let p = &self.program;
        match f.kind {
            FusionKind::Computation => "computation kernel".to_string(),
            FusionKind::Collective(c) => format!("fused {}", p.node(c).op.name()),
            FusionKind::AllReduce { reduce_scatter } => {
                format!("fused all-reduce from {}", p.label(reduce_scatter))
            }
        }
    }

    /// Graphviz dot: the program's graph with each fusion group as a cluster and overlap
    /// pairs as dashed red edges.
    pub fn to_dot(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "digraph \"{} / {}\" {{", self.program.name(), self.name);
        let _ = writeln!(s, "  rankdir=TB;");
        dot_body(&self.program, &mut s);
        for (g, f) in self.fusions.iter().enumerate() {
            let _ = writeln!(
                s,
                "  subgraph cluster_f{g} {{ label=\"f{g}: {}\"; style=filled; color=lightgrey;",
                self.fusion_title(g)
            );
            for m in &f.members {
                let _ = writeln!(s, "    n{};", m.0);
            }
            let _ = writeln!(s, "  }}");
        }
        for o in &self.overlaps {
            let _ = writeln!(
                s,
                "  n{} -> n{} [style=dashed, color=red, label=\"overlap\"];",
                o.producer.0, o.consumer.0
            );
        }
        s.push_str("}\n");
        s
    }
}

/// ```text
/// schedule fuse(RS-C-AG) of adam
///   split(g1) -> g1_rs, all_gather g1
///   ...
/// program adam (1 group)
///   [f0] g1_rs = reduce_scatter(Sum, g, dim=0) : f32 Sliced(0) [N]
///   ...
/// f0: fused all-reduce from g1_rs (12 stages)
/// ```
impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.program;
        writeln!(f, "schedule {} of {}", self.name, p.name())?;
        for step in &self.steps {
            writeln!(f, "  {step}")?;
        }
        writeln!(f, "{}", p.header())?;
        for id in p.ids() {
            let Some(line) = p.stage_line(id) else {
                continue;
            };
            let tag = match self.fusion_of(id) {
                Some(g) => format!("[f{g}] "),
                None => String::new(),
            };
            writeln!(f, "  {tag}{line}")?;
        }
        if let Some(r) = p.return_line() {
            writeln!(f, "  {r}")?;
        }
        for (g, fu) in self.fusions.iter().enumerate() {
            writeln!(
                f,
                "f{g}: {} ({} stages)",
                self.fusion_title(g),
                fu.members.len()
            )?;
        }
        for o in &self.overlaps {
            let side = |v| match self.fusion_of(v) {
                Some(g) => format!("{} [f{g}]", p.label(v)),
                None => p.label(v),
            };
            writeln!(f, "overlap: {} with {}", side(o.producer), side(o.consumer))?;
        }
        Ok(())
    }
}
