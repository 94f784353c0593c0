//! `reorder`: move computations that consume an all-gather before it, so they run on
//! each rank's slice (1/P of the work) and only their results are gathered.

use super::error::ScheduleError;
use super::rewrite::{Rewrite, users};
use super::scheduled::Schedule;
use crate::Collective;
use crate::{
    BinaryOp, CheckError, Dim, Layout, Op, Program, ReduceKind, ReduceOp, UnaryOp, ValueId,
};
use std::collections::{BTreeSet, HashMap};

const T: &str = "reorder";

/// What [`Schedule::reorder`] made.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Reordered {
    /// The reordered computations, now on slices (ids of the sliced values).
    pub sliced: Vec<ValueId>,
    /// The all-gathers that re-replicate values needed after the computations (for
    /// updates of Replicated inputs and for live-outs), in program order.
    pub gathers: Vec<ValueId>,
    /// The cross-rank all-reduces that complete reductions of now-sliced values.
    pub reductions: Vec<ValueId>,
}

impl Schedule {
    /// Moves `comps` — computations that consume all-gather `ag`, directly or through one
    /// another, and pointwise computations feeding them — before the all-gather:
    ///
    /// - they read the all-gather's Sliced input instead of its output; a Replicated
    ///   operand is sliced only if it spans the sliced dim (an operand broadcast along it,
    ///   such as a bias, is used whole); a pointwise computation in `comps` that does not
    ///   read the all-gather (`beta1 * m`) is computed on the slices of its operands, so
    ///   an input it reads is only ever read through its slice (`scatter`);
    /// - `update(t, e)` of a Replicated input becomes `update(t, all_gather(e_slice))`;
    /// - a full reduction of a now-sliced value becomes a per-rank partial reduction and
    ///   the all-reduce that completes it (`norm2` as `sqrt(all_reduce(Σ x²))`); so does
    ///   a full reduction in `comps` of a Replicated tensor that does not consume the
    ///   all-gather (LAMB's `norm2(w)`), on the tensor's slices along dim 0;
    /// - values used after the computations (or returned) are re-gathered: the
    ///   all-gather keeps the value's id and name, and the slice is named `<name>_slice`.
    ///
    /// The original all-gather stays only if something else still uses it.
    pub fn reorder(
        &mut self,
        comps: &[ValueId],
        ag: impl Into<ValueId>,
    ) -> Result<Reordered, ScheduleError> {
        self.before_annotations(T)?;
        let ag = self.stage(T, ag)?;
        let p = &self.program;
        let Op::Collective(Collective::AllGather, src) = p.node(ag).op else {
            return Err(ScheduleError::new(
                T,
                format!(
                    "{} is {}, not an all_gather",
                    self.label(ag),
                    super::error::article(p.node(ag).op.name())
                ),
            ));
        };
        if comps.is_empty() {
            return Err(ScheduleError::new(T, "no computations to reorder"));
        }
        let mut set = BTreeSet::new();
        for &c in comps {
            let c = self.stage(T, c)?;
            let op = &p.node(c).op;
            if matches!(op, Op::TensorInput | Op::ScalarInput | Op::Literal(_))
                || (op.is_communication() && !matches!(op, Op::Collective(Collective::Send(_), _)))
            {
                return Err(ScheduleError::new(
                    T,
                    format!(
                        "{} is {}; only computations (and sends) can be reordered",
                        self.label(c),
                        super::error::article(op.name())
                    ),
                ));
            }
            set.insert(c);
        }
        // Computations fed by the all-gather, directly or through others.
        let mut fed = BTreeSet::new();
        for id in p.ids().filter(|id| set.contains(id)) {
            if p.node(id)
                .op
                .operands()
                .iter()
                .any(|o| *o == ag || fed.contains(o))
            {
                fed.insert(id);
            }
        }
        if fed.is_empty() {
            return Err(ScheduleError::new(
                T,
                format!("none of the computations consumes {}", self.label(ag)),
            ));
        }
        for &c in set.difference(&fed) {
            if let Op::ReduceAll(_, x) = p.node(c).op {
                let t = &p.node(x).ty;
                let what = if t.layout != Layout::Replicated {
                    Some(format!("{:?}", t.layout))
                } else if t.shape.0.first().is_none_or(|d| *d == Dim::Const(1)) {
                    Some("a Replicated value without a dim 0 to slice".to_string())
                } else {
                    None
                };
                if let Some(what) = what {
                    return Err(ScheduleError::new(
                        T,
                        format!(
                            "{} reduces {} ({what}); only a full reduction of a Replicated \
                             tensor whose dim 0 can be sliced can be computed on slices \
                             without consuming {}",
                            self.label(c),
                            self.label(x),
                            self.label(ag)
                        ),
                    ));
                }
            } else if !is_pointwise(&p.node(c).op) {
                return Err(ScheduleError::new(
                    T,
                    format!(
                        "{} ({}) does not consume {}; only pointwise computations feeding the \
                         reordered ones can come along",
                        self.label(c),
                        p.node(c).op.name(),
                        self.label(ag)
                    ),
                ));
            }
        }
        let mut r = Reorder {
            p,
            rw: Rewrite::new(p),
            users: users(p),
            comps: set,
            fed,
            ag,
            src,
            sliced: HashMap::new(),
            pulled: HashMap::new(),
            scattered: HashMap::new(),
            made: Reordered::default(),
        };
        for id in p.ids() {
            r.visit(id)?;
        }
        let made = r.made;
        let program = r.rw.finish().map_err(|e| ScheduleError::check(T, e))?;
        let names: Vec<String> = comps.iter().map(|&c| p.label(c)).collect();
        let step = format!("reorder([{}], {})", names.join(", "), p.label(ag));
        self.replace(program, step);
        Ok(made)
    }
}

struct Reorder<'a> {
    p: &'a Program,
    rw: Rewrite<'a>,
    users: HashMap<ValueId, Vec<ValueId>>,
    comps: BTreeSet<ValueId>,
    fed: BTreeSet<ValueId>,
    ag: ValueId,
    src: ValueId,
    /// Fed computation -> its sliced value.
    sliced: HashMap<ValueId, ValueId>,
    /// (pointwise computation not fed by the all-gather, dim) -> computed on slices.
    pulled: HashMap<(ValueId, usize), ValueId>,
    /// (value, dim) -> scatter of its whole value.
    scattered: HashMap<(ValueId, usize), ValueId>,
    made: Reordered,
}

impl Reorder<'_> {
    /// Full reduction `id` of `x`, now on slices: a partial reduction on each rank and
    /// the all-reduce that completes it (`norm2` as `sqrt(all_reduce(Σ x²))`).
    fn reduce_slices(
        &mut self,
        id: ValueId,
        kind: ReduceKind,
        x: ValueId,
    ) -> Result<(), ScheduleError> {
        let p = self.p;
        let node = p.node(id).clone();
        let (partial_kind, combine) = match kind {
            ReduceKind::Sum | ReduceKind::Norm2 => (ReduceKind::Sum, ReduceOp::Sum),
            ReduceKind::Max => (ReduceKind::Max, ReduceOp::Max),
            ReduceKind::Min => (ReduceKind::Min, ReduceOp::Min),
        };
        let e = |e| slice_err(p, id, e);
        let b = &mut self.rw.b;
        let norm = kind == ReduceKind::Norm2;
        let input = if norm {
            b.binary(BinaryOp::Mul, x, x).map_err(e)?
        } else {
            x
        };
        let partial = b.reduce_all(partial_kind, input).map_err(e)?;
        if !norm {
            b.reuse_id(id).map_err(e)?;
        }
        let total = b.all_reduce(combine, partial).map_err(e)?;
        self.made.reductions.push(total);
        let result = if norm {
            b.reuse_id(id).map_err(e)?;
            b.unary(UnaryOp::Sqrt, total).map_err(e)?
        } else {
            total
        };
        if let Some(n) = &node.name {
            b.bind(result, n).map_err(e)?;
        }
        self.rw.map.insert(id, result);
        Ok(())
    }
    fn used_outside(&self, v: ValueId) -> bool {
        self.p.outputs().contains(&v)
            || self
                .users
                .get(&v)
                .is_some_and(|us| us.iter().any(|u| !self.comps.contains(u)))
    }

    /// The whole (unsliced) new value of old `v`, computing a deferred one on demand.
    fn whole(&mut self, v: ValueId) -> Result<ValueId, ScheduleError> {
        if let Some(&n) = self.rw.map.get(&v) {
            return Ok(n);
        }
        let ops = self.operands(v, |s, x| s.whole(x))?;
        let keep = (!self.rw.b.program().contains(v)).then_some(v);
        let n = self
            .rw
            .emit_with(v, keep, |o| ops[&o])
            .map_err(|e| slice_err(self.p, v, e))?;
        self.rw.map.insert(v, n);
        Ok(n)
    }

    /// Old `v` sliced along its dim `dim`.
    fn slice(&mut self, v: ValueId, dim: usize) -> Result<ValueId, ScheduleError> {
        if v == self.ag {
            return Ok(self.rw.get(self.src));
        }
        if let Some(&s) = self.sliced.get(&v) {
            return Ok(s);
        }
        let pullable = self.comps.contains(&v) && !self.fed.contains(&v);
        if pullable {
            if let Some(&s) = self.pulled.get(&(v, dim)) {
                return Ok(s);
            }
            let rank = self.p.node(v).ty.shape.rank();
            let ops = self.operands(v, |s, x| s.operand_for(x, dim, rank))?;
            // The sliced version takes the id and name unless the whole one is needed.
            let keep = (!self.used_outside(v) && !self.rw.b.program().contains(v)).then_some(v);
            let s = self
                .rw
                .emit_with(v, keep, |o| ops[&o])
                .map_err(|e| slice_err(self.p, v, e))?;
            self.pulled.insert((v, dim), s);
            return Ok(s);
        }
        if let Some(&s) = self.scattered.get(&(v, dim)) {
            return Ok(s);
        }
        let w = self.whole(v)?;
        let s = self
            .rw
            .b
            .scatter(w, dim)
            .map_err(|e| slice_err(self.p, v, e))?;
        self.scattered.insert((v, dim), s);
        Ok(s)
    }

    /// Operand `x` of a pointwise value of rank `rank` sliced along `dim`: sliced if it
    /// spans that dim, whole if it is broadcast along it (or a scalar).
    fn operand_for(
        &mut self,
        x: ValueId,
        dim: usize,
        rank: usize,
    ) -> Result<ValueId, ScheduleError> {
        let shape = &self.p.node(x).ty.shape;
        match (dim + shape.rank()).checked_sub(rank) {
            Some(od) if od < shape.rank() && shape.0[od] != Dim::Const(1) => self.slice(x, od),
            _ => self.whole(x),
        }
    }

    fn operands(
        &mut self,
        v: ValueId,
        mut f: impl FnMut(&mut Self, ValueId) -> Result<ValueId, ScheduleError>,
    ) -> Result<HashMap<ValueId, ValueId>, ScheduleError> {
        let mut m = HashMap::new();
        for o in self.p.node(v).op.operands() {
            let n = f(self, o)?;
            m.insert(o, n);
        }
        Ok(m)
    }

    fn visit(&mut self, id: ValueId) -> Result<(), ScheduleError> {
        let p = self.p;
        if id == self.ag {
            if self.used_outside(id) {
                self.whole(id)?;
            }
            return Ok(());
        }
        if let Op::ReduceAll(kind, x) = p.node(id).op
            && self.comps.contains(&id)
            && !self.fed.contains(&id)
        {
            // A full reduction of a Replicated value that came along: each rank reduces
            // its slice (1/P of the reads) and an all-reduce completes it.
            let xs = self.slice(x, 0)?;
            if !matches!(self.rw.b.ty(xs).layout, Layout::Sliced(_)) {
                // Every operand was used whole (broadcast along dim 0): a partial
                // reduction would count every rank's copy.
                return Err(ScheduleError::new(
                    T,
                    format!(
                        "`{}` cannot be computed on slices: its operand `{}` is not sliced \
                         along dim 0 (it is broadcast there)",
                        p.label(id),
                        p.label(x)
                    ),
                ));
            }
            return self.reduce_slices(id, kind, xs);
        }
        if !self.fed.contains(&id) {
            // Pulled-along computations are made on demand; the rest is copied. An output
            // has no user to demand its whole value, so it is made whole here.
            let deferred = self.comps.contains(&id)
                && !matches!(p.node(id).op, Op::Update { .. })
                && !p.outputs().contains(&id)
                && self.users.get(&id).is_some_and(|u| !u.is_empty());
            if !deferred {
                self.whole(id)?;
            }
            return Ok(());
        }
        let node = p.node(id).clone();
        // The dim along which the sliced operands are split, in the result's dims.
        let rank = node.ty.shape.rank();
        let along = node.op.operands().into_iter().find_map(|x| {
            let s = if x == self.ag {
                self.rw.get(self.src)
            } else {
                *self.sliced.get(&x)?
            };
            let t = self.rw.b.ty(s);
            match t.layout {
                Layout::Sliced(d) => (d + rank).checked_sub(t.shape.rank()),
                _ => None,
            }
        });
        let pointwise = is_pointwise(&node.op);
        let ops = self.operands(id, |s, x| {
            if x == s.ag || s.sliced.contains_key(&x) {
                s.slice(x, 0)
            } else {
                match along {
                    Some(d) if pointwise => s.operand_for(x, d, rank),
                    _ => s.whole(x),
                }
            }
        })?;
        match node.op {
            Op::Update { target, value } => {
                let (v, t) = (ops[&value], ops[&target]);
                let b = &mut self.rw.b;
                if b.ty(v).layout == b.ty(t).layout {
                    let n = self
                        .rw
                        .copy_with(id, |o| ops[&o])
                        .map_err(|e| slice_err(self.p, id, e))?;
                    self.sliced.insert(id, n);
                } else {
                    let e = |e| slice_err(p, id, e);
                    let g = self.rw.b.all_gather(v).map_err(e)?;
                    self.rw.b.reuse_id(id).map_err(e)?;
                    let u = self.rw.b.update(t, g).map_err(e)?;
                    if let Some(n) = &node.name {
                        self.rw.b.bind(u, n).map_err(e)?;
                    }
                    self.rw.map.insert(id, u);
                    self.sliced.insert(id, v);
                    self.made.gathers.push(g);
                }
            }
            Op::ReduceAll(kind, x) if matches!(self.rw.b.ty(ops[&x]).layout, Layout::Sliced(_)) => {
                self.reduce_slices(id, kind, ops[&x])?;
            }
            _ => {
                let will_slice = ops
                    .values()
                    .any(|&v| matches!(self.rw.b.ty(v).layout, Layout::Sliced(_)));
                let live_out = self.used_outside(id);
                let keep = (!(live_out && will_slice)).then_some(id);
                let v = self
                    .rw
                    .emit_with(id, keep, |o| ops[&o])
                    .map_err(|e| slice_err(self.p, id, e))?;
                if !matches!(self.rw.b.ty(v).layout, Layout::Sliced(_)) {
                    self.rw.map.insert(id, v);
                    return Ok(());
                }
                self.sliced.insert(id, v);
                self.made.sliced.push(v);
                if live_out {
                    let e = |e| slice_err(p, id, e);
                    let b = &mut self.rw.b;
                    if let Some(n) = &node.name {
                        b.bind(v, &format!("{n}_slice")).map_err(e)?;
                    }
                    b.reuse_id(id).map_err(e)?;
                    let g = b.all_gather(v).map_err(e)?;
                    if let Some(n) = &node.name {
                        b.bind(g, n).map_err(e)?;
                    }
                    self.rw.map.insert(id, g);
                    self.made.gathers.push(g);
                } else {
                    self.rw.map.insert(id, v);
                }
            }
        }
        Ok(())
    }
}

fn slice_err(p: &Program, id: ValueId, e: CheckError) -> ScheduleError {
    ScheduleError::new(
        T,
        format!(
            "`{}` cannot be computed on slices: {}",
            p.label(id),
            e.message
        ),
    )
}

pub(crate) fn is_pointwise(op: &Op) -> bool {
    matches!(
        op,
        Op::Unary(..) | Op::Binary(..) | Op::Select(..) | Op::Cast(..) | Op::Dropout { .. }
    )
}
