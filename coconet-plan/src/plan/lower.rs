//! Lowering a schedule to a [`Plan`].

use super::fused::{FusedAllGather, FusedAllReduce};
use super::lowered::{Plan, PlanStep, Slot, Storage, resolve};
use crate::RuntimeError;
use coconet_core::Collective;
use coconet_core::schedule::FusionKind;
use coconet_core::{InterpError, Layout, Op, Placement, Program, Schedule, ValueId, block_range};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Pointwise stages a kernel evaluates elementwise (an update is a store).
pub fn is_kernel_op(op: &Op) -> bool {
    matches!(
        op,
        Op::Unary(..)
            | Op::Binary(..)
            | Op::Select(..)
            | Op::Cast(..)
            | Op::Dropout { .. }
            | Op::Update { .. }
    )
}

/// Lowers `schedule` for `ranks` ranks with the given dims (see the module docs),
/// keeping the `observed` values in memory until the end of a run like outputs.
pub(crate) fn lower(
    schedule: &Schedule,
    ranks: usize,
    dims: &BTreeMap<String, usize>,
    observed: &[ValueId],
) -> Result<Plan, RuntimeError> {
    let p = schedule.program();
    let observed: Vec<ValueId> = observed
        .iter()
        .map(|&v| resolve(schedule, v))
        .collect::<Result<_, _>>()?;
    let group_size = p.group_size(ranks)?;
    let mut shapes = HashMap::new();
    for id in p.ids() {
        let s = p
            .node(id)
            .ty
            .shape
            .resolve(dims)
            .map_err(|dim| InterpError::UnboundDim {
                dim,
                used_by: p.label(id),
            })?;
        let (dtype, what) = (
            p.node(id).ty.dtype,
            format!("`{}` ({})", p.label(id), p.node(id).op.name()),
        );
        coconet_core::checked_size(&what, &s, dtype, dtype.size_bytes())?;
        shapes.insert(id, s);
    }
    for id in p.ids() {
        let Some(root) = p.node(id).op.collective().and_then(|(c, _)| c.root()) else {
            continue;
        };
        if root >= group_size {
            return Err(InterpError::Root {
                op: p.node(id).op.name(),
                value: p.label(id),
                root,
                group_size,
            }
            .into());
        }
    }
    for (t, _) in p.updates() {
        for &o in p.outputs() {
            let mut v = o;
            while let Op::Scatter(x, _) = p.node(v).op {
                v = x;
            }
            if v == t {
                return Err(RuntimeError::Plan(format!(
                    "output `{}` is (a view of) input `{}`, which the program also updates; the \
                     runtime does not keep the original value for outputs yet — return a copy \
                     computed before the update instead",
                    p.label(o),
                    p.label(t)
                )));
            }
        }
    }
    let mut l = Lowering {
        p,
        schedule,
        shapes,
        group_size,
        ranks,
        uniform: BTreeSet::new(),
        units: Vec::new(),
        unit_of: HashMap::new(),
        observed: observed.into_iter().collect(),
    };
    l.find_uniform();
    l.form_units();
    let order = l.order_units()?;
    let units: Vec<Unit> = order.iter().map(|&u| l.units[u].clone()).collect();
    l.unit_of = units
        .iter()
        .enumerate()
        .flat_map(|(i, u)| u.members().into_iter().map(move |m| (m, i)))
        .collect();
    l.units = units;
    let (storage, commits, elided) = l.storage();
    let (storage, slots, overwritten) = l.slots(&storage, &commits);
    let mut steps = Vec::new();
    let uniform: Vec<ValueId> = p.ids().filter(|v| l.uniform.contains(v)).collect();
    if !uniform.is_empty() {
        steps.push(PlanStep::Uniform(uniform));
    }
    for u in &l.units {
        if let Some(s) = u.step(p, &elided) {
            steps.push(s);
        }
    }
    for (target, update) in commits {
        steps.push(PlanStep::Commit { target, update });
    }
    Ok(Plan {
        schedule: schedule.clone(),
        ranks,
        group_size,
        dims: dims.clone(),
        shapes: l.shapes,
        steps,
        storage,
        slots,
        overwritten,
    })
}

/// Storage of every value, the updates committed at the end `(input, update)`, and the
/// updates whose value is written straight into the input by its producer.
type StorageChoice = (
    HashMap<ValueId, Storage>,
    Vec<(ValueId, ValueId)>,
    BTreeSet<ValueId>,
);

#[derive(Debug, Clone)]
enum Unit {
    Kernel(Vec<ValueId>),
    Op(ValueId),
    Fused {
        rs: ValueId,
        members: Vec<ValueId>,
        overlap: Option<ValueId>,
    },
    /// A kernel and the all-gathers (and their updates) of its stages.
    Gathered(Vec<ValueId>),
}

impl Unit {
    fn members(&self) -> Vec<ValueId> {
        match self {
            Unit::Kernel(m) | Unit::Gathered(m) => m.clone(),
            Unit::Op(v) => vec![*v],
            Unit::Fused {
                rs,
                members,
                overlap,
            } => overlap
                .iter()
                .copied()
                .chain([*rs])
                .chain(members.iter().copied())
                .collect(),
        }
    }

    fn step(&self, p: &Program, elided: &BTreeSet<ValueId>) -> Option<PlanStep> {
        match self {
            Unit::Kernel(m) => {
                let m: Vec<ValueId> = m.iter().copied().filter(|v| !elided.contains(v)).collect();
                (!m.is_empty()).then_some(PlanStep::Kernel(m))
            }
            Unit::Op(v) => Some(PlanStep::Op(*v)),
            Unit::Gathered(m) => Some(PlanStep::FusedAllGather(FusedAllGather::new(p, m))),
            Unit::Fused {
                rs,
                members,
                overlap,
            } => {
                let fused = FusedAllReduce::new(p, *rs, members)
                    .expect("lowering fuses only dim-0 reduce-scatters");
                Some(match overlap {
                    Some(mm) => PlanStep::Overlap {
                        matmul: *mm,
                        consumer: fused,
                    },
                    None => PlanStep::FusedAllReduce(fused),
                })
            }
        }
    }
}

struct Lowering<'a> {
    p: &'a Program,
    schedule: &'a Schedule,
    shapes: HashMap<ValueId, Vec<usize>>,
    group_size: usize,
    ranks: usize,
    uniform: BTreeSet<ValueId>,
    units: Vec<Unit>,
    unit_of: HashMap<ValueId, usize>,
    /// Values to keep in memory to the end like outputs (to read them after a run).
    observed: BTreeSet<ValueId>,
}

impl Lowering<'_> {
    fn find_uniform(&mut self) {
        for id in self.p.ids() {
            let op = &self.p.node(id).op;
            let u = match op {
                Op::ScalarInput | Op::Literal(_) => true,
                Op::Unary(..) | Op::Binary(..) | Op::Select(..) | Op::Cast(..) => {
                    op.operands().iter().all(|o| self.uniform.contains(o))
                }
                _ => false,
            };
            if u {
                self.uniform.insert(id);
            }
        }
    }

    /// Values without a step of their own: inputs, uniform scalars, views.
    fn stepless(&self, v: ValueId) -> bool {
        self.uniform.contains(&v) || matches!(self.p.node(v).op, Op::TensorInput | Op::Scatter(..))
    }

    fn push(&mut self, u: Unit) {
        let i = self.units.len();
        for m in u.members() {
            self.unit_of.insert(m, i);
        }
        self.units.push(u);
    }

    /// A layer norm a kernel can run over row-aligned chunks (its parameters in memory).
    fn row_op(&self, m: ValueId) -> bool {
        match self.p.node(m).op {
            Op::LayerNorm { gamma, beta, .. } => !self
                .schedule
                .fusions()
                .iter()
                .any(|f| f.members.contains(&gamma) || f.members.contains(&beta)),
            _ => false,
        }
    }

    /// Units for a fusion group that cannot run as one: maximal runs of consecutive (in
    /// program order) members that fit one kernel, every other member its own unit. A run
    /// never spans a node outside the group (stepless ones aside), so every run is convex
    /// and the units stay acyclic.
    fn push_runs(&mut self, members: &[ValueId], done: &mut BTreeSet<ValueId>) {
        self.push_runs_around(members, &BTreeSet::new(), done);
    }

    /// [`Self::push_runs`] where `placed` (the group's first pass, already a unit) are
    /// passed over like stepless values: they depend on no member left, so a run may
    /// span them.
    fn push_runs_around(
        &mut self,
        members: &[ValueId],
        placed: &BTreeSet<ValueId>,
        done: &mut BTreeSet<ValueId>,
    ) {
        let p = self.p;
        let (Some(&first), Some(&last)) = (members.first(), members.last()) else {
            return;
        };
        let span: Vec<ValueId> = p
            .ids()
            .skip_while(|&v| v != first)
            .take_while(|&v| v != last)
            .chain([last])
            .collect();
        let mut run: Vec<ValueId> = Vec::new();
        for id in span {
            if self.stepless(id) || placed.contains(&id) {
                continue;
            }
            let member = members.contains(&id);
            if member && !run.is_empty() {
                run.push(id);
                if self.one_kernel(&run) {
                    continue;
                }
                run.pop();
            }
            if !run.is_empty() {
                self.push(Unit::Kernel(std::mem::take(&mut run)));
            }
            if !member {
                continue;
            }
            if self.one_kernel(&[id]) {
                run.push(id);
            } else if is_kernel_op(&p.node(id).op) {
                self.push(Unit::Kernel(vec![id]));
            } else {
                self.push(Unit::Op(id));
            }
        }
        if !run.is_empty() {
            self.push(Unit::Kernel(run));
        }
        done.extend(members.iter().copied());
    }

    /// The members of a fused all-reduce group (`rest`: all but the reduce-scatter, in
    /// program order) the first pass computes: the full reductions and the updates (and
    /// gathers) one pass over the reduced chunks can compute, with what they need. A
    /// member can be in the pass if one pass allows it and its operands in the group are
    /// in the pass too — not only a prefix (LAMB's partial ‖w‖ comes after ‖r‖'s
    /// all-reduce in program order but needs nothing from it); operands outside the group
    /// are inputs, views, uniform scalars or values computed before the reduce-scatter.
    /// Of those, only what a reduction, an update or a gather of the pass needs is taken:
    /// anything else would be stored for the second pass and read back (the clipped
    /// AdamW's `beta1 * m`), where the second pass computes it in registers.
    fn first_pass(&self, rs: ValueId, group: &[ValueId], rest: &[ValueId]) -> Vec<ValueId> {
        let p = self.p;
        let pos: HashMap<ValueId, usize> = p.ids().enumerate().map(|(i, v)| (v, i)).collect();
        let mut can: Vec<ValueId> = Vec::new();
        for &m in rest {
            let ready = p.node(m).op.operands().iter().all(|&o| {
                o == rs
                    || can.contains(&o)
                    || (!group.contains(&o) && (self.stepless(o) || pos[&o] < pos[&rs]))
            });
            can.push(m);
            if !ready || !self.one_pass(rs, &can) {
                can.pop();
            }
        }
        let mut wanted: BTreeSet<ValueId> = BTreeSet::new();
        let mut stack: Vec<ValueId> = can
            .iter()
            .copied()
            .filter(|&m| {
                matches!(
                    p.node(m).op,
                    Op::ReduceAll(..)
                        | Op::Update { .. }
                        | Op::Collective(Collective::AllGather, _)
                )
            })
            .collect();
        while let Some(m) = stack.pop() {
            if wanted.insert(m) {
                stack.extend(
                    p.node(m)
                        .op
                        .operands()
                        .into_iter()
                        .filter(|o| can.contains(o)),
                );
            }
        }
        can.retain(|m| wanted.contains(m));
        can
    }

    /// Merges each all-gather among `units[first..]` (one fusion group's) into the kernel
    /// among them that computes its operand — sliced along dim 0 over the kernel's
    /// iteration space — with the update that commits it where that is a unit of its
    /// own: the kernel then sends its results to every peer as it computes them.
    fn gather_from_kernels(&mut self, first: usize) {
        let p = self.p;
        let mut units: Vec<Unit> = self.units.drain(first..).collect();
        let mut i = 0;
        while i < units.len() {
            let Unit::Op(ag) = units[i] else {
                i += 1;
                continue;
            };
            let Op::Collective(Collective::AllGather, x) = p.node(ag).op else {
                i += 1;
                continue;
            };
            let sliced = p.node(x).ty.layout == Layout::Sliced(0);
            let host = (0..i).find(|&k| {
                matches!(&units[k], Unit::Kernel(run) | Unit::Gathered(run)
                    if run.contains(&x) && sliced && self.shapes[&run[0]] == self.shapes[&x])
            });
            let Some(k) = host else {
                i += 1;
                continue;
            };
            let update = (i + 1..units.len()).find(|&j| {
                matches!(&units[j], Unit::Kernel(run)
                    if run.len() == 1
                        && matches!(p.node(run[0]).op, Op::Update { value, .. } if value == ag))
            });
            let mut merged = units[k].members();
            merged.push(ag);
            if let Some(j) = update {
                merged.extend(units[j].members());
                units.remove(j);
            }
            units[k] = Unit::Gathered(merged);
            units.remove(i);
        }
        for u in units {
            self.push(u);
        }
    }

    /// Whether `members` can be one chunked kernel: pointwise, one iteration space (a
    /// run of scalars too: LAMB's trust-ratio arithmetic is one kernel, not five).
    fn one_kernel(&self, members: &[ValueId]) -> bool {
        let first = self.p.node(members[0]);
        members.iter().all(|&m| {
            let n = self.p.node(m);
            (is_kernel_op(&n.op) || self.row_op(m))
                && n.ty.layout == first.ty.layout
                && n.ty.placement == first.ty.placement
                && self.shapes[&m] == self.shapes[&members[0]]
        })
    }

    /// Whether a fused all-reduce group can run as one pass over chunks of dim 0.
    fn one_pass(&self, rs: ValueId, members: &[ValueId]) -> bool {
        let p = self.p;
        let Op::Collective(Collective::ReduceScatter(_, 0), _) = p.node(rs).op else {
            return false;
        };
        let iter = &self.shapes[&rs];
        members.iter().all(|&m| {
            let n = p.node(m);
            match n.op {
                // The gathered value must be computed by the pass itself.
                Op::Collective(Collective::AllGather, x) => {
                    (x == rs || members.contains(&x))
                        && p.node(x).ty.layout == Layout::Sliced(0)
                        && self.shapes[&x] == *iter
                }
                Op::Update { value, .. } => {
                    self.shapes[&m] == *iter
                        && (n.ty.layout == Layout::Sliced(0)
                            || (matches!(
                                p.node(value).op,
                                Op::Collective(Collective::AllGather, _)
                            ) && members.contains(&value)))
                }
                // A full reduction of a stage, folded as the chunks are computed.
                Op::ReduceAll(_, x) => {
                    (x == rs || members.contains(&x) && is_kernel_op(&p.node(x).op))
                        && p.node(x).ty.layout == Layout::Sliced(0)
                        && self.shapes[&x] == *iter
                }
                ref op if is_kernel_op(op) || self.row_op(m) => {
                    n.ty.layout == Layout::Sliced(0) && self.shapes[&m] == *iter
                }
                _ => false,
            }
        })
    }

    fn form_units(&mut self) {
        let p = self.p;
        let fusions = self.schedule.fusions().to_vec();
        let mut done: BTreeSet<ValueId> = BTreeSet::new();
        for f in &fusions {
            let members: Vec<ValueId> = p.ids().filter(|v| f.members.contains(v)).collect();
            match f.kind {
                FusionKind::AllReduce { reduce_scatter } => {
                    let rest: Vec<ValueId> = members
                        .iter()
                        .copied()
                        .filter(|&m| m != reduce_scatter && !self.stepless(m))
                        .collect();
                    if self.one_pass(reduce_scatter, &rest) {
                        let overlap = self
                            .schedule
                            .overlaps()
                            .iter()
                            .find(|o| o.consumer == reduce_scatter)
                            .map(|o| o.producer)
                            .filter(|&mm| {
                                matches!(p.node(mm).op, Op::MatMul(..))
                                    && matches!(p.node(reduce_scatter).op, Op::Collective(Collective::ReduceScatter(_, _), x) if x == mm)
                            });
                        if let Some(mm) = overlap {
                            done.insert(mm);
                        }
                        done.extend(members.iter().copied());
                        self.push(Unit::Fused {
                            rs: reduce_scatter,
                            members: rest,
                            overlap,
                        });
                    } else {
                        // Not one pass (e.g. LAMB's update needs both norms complete):
                        // two. The first reduces the gradients and computes what one
                        // pass can (no peer's block is copied into a buffer and read
                        // back), folding the partial norms; then the rest as few kernels
                        // as it allows, the last one sending its results to every peer.
                        let first = self.first_pass(reduce_scatter, &members, &rest);
                        let mut placed = BTreeSet::new();
                        if !first.is_empty() {
                            done.insert(reduce_scatter);
                            done.extend(first.iter().copied());
                            placed.extend(first.iter().copied());
                            self.push(Unit::Fused {
                                rs: reduce_scatter,
                                members: first,
                                overlap: None,
                            });
                        }
                        let left: Vec<ValueId> = members
                            .iter()
                            .copied()
                            .filter(|m| !done.contains(m))
                            .collect();
                        let first = self.units.len();
                        self.push_runs_around(&left, &placed, &mut done);
                        self.gather_from_kernels(first);
                    }
                }
                FusionKind::Computation => {
                    let ms: Vec<ValueId> = members
                        .iter()
                        .copied()
                        .filter(|&m| !self.stepless(m))
                        .collect();
                    if !ms.is_empty() && self.one_kernel(&ms) {
                        done.extend(members.iter().copied());
                        self.push(Unit::Kernel(ms));
                    } else {
                        self.push_runs(&members, &mut done);
                    }
                }
                // Computation fused into a single collective (e.g. a send): not fused
                // into the collective yet; its computation runs as few kernels as it
                // allows, then the collective.
                FusionKind::Collective(_) => self.push_runs(&members, &mut done),
            }
        }
        for id in p.ids() {
            if done.contains(&id) || self.stepless(id) {
                continue;
            }
            if is_kernel_op(&p.node(id).op) {
                self.push(Unit::Kernel(vec![id]));
            } else {
                self.push(Unit::Op(id));
            }
        }
    }

    /// The unit producing `v`'s data (through views), if any.
    fn producer(&self, v: ValueId) -> Option<usize> {
        match self.p.node(v).op {
            Op::Scatter(x, _) => self.producer(x),
            _ => self.unit_of.get(&v).copied(),
        }
    }

    /// Topological order of the units (ties broken by program order).
    fn order_units(&self) -> Result<Vec<usize>, RuntimeError> {
        let n = self.units.len();
        let pos: HashMap<ValueId, usize> = self.p.ids().enumerate().map(|(i, v)| (v, i)).collect();
        let mut deps: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); n];
        for (i, u) in self.units.iter().enumerate() {
            for m in u.members() {
                for o in self.p.node(m).op.operands() {
                    if let Some(j) = self.producer(o)
                        && j != i
                    {
                        deps[i].insert(j);
                    }
                }
            }
        }
        let key = |i: usize| {
            self.units[i]
                .members()
                .iter()
                .map(|m| pos[m])
                .max()
                .unwrap_or(0)
        };
        let mut placed = vec![false; n];
        let mut order = Vec::with_capacity(n);
        while order.len() < n {
            let next = (0..n)
                .filter(|&i| !placed[i] && deps[i].iter().all(|&d| placed[d]))
                .min_by_key(|&i| key(i))
                .ok_or_else(|| RuntimeError::Plan("the fused steps form a cycle".into()))?;
            placed[next] = true;
            order.push(next);
        }
        Ok(order)
    }

    /// Readers of input `t`'s buffer: direct users and users of its views.
    fn readers(&self, t: ValueId, users: &HashMap<ValueId, Vec<ValueId>>) -> Vec<ValueId> {
        let mut out = Vec::new();
        for &u in users.get(&t).map(Vec::as_slice).unwrap_or_default() {
            match self.p.node(u).op {
                Op::Scatter(..) => out.extend(self.readers(u, users)),
                Op::Update { target, .. } if target == t => {}
                _ => out.push(u),
            }
        }
        out
    }

    /// Storage of every value; updates to commit at the end; updates whose value is
    /// written straight into the input by its producer.
    fn storage(&self) -> StorageChoice {
        let p = self.p;
        let mut users: HashMap<ValueId, Vec<ValueId>> = HashMap::new();
        for id in p.ids() {
            for o in p.node(id).op.operands() {
                users.entry(o).or_default().push(id);
            }
        }
        let mut storage = HashMap::new();
        let mut commits = Vec::new();
        let mut elided = BTreeSet::new();
        for id in p.ids() {
            let node = p.node(id);
            let s = match node.op {
                Op::TensorInput => Storage::Input(id),
                Op::Scatter(x, d) => Storage::View { of: x, dim: d },
                _ if self.uniform.contains(&id) => Storage::Uniform,
                _ => continue,
            };
            storage.insert(id, s);
        }
        for (target, update) in p.updates() {
            let Op::Update { value, .. } = p.node(update).op else {
                unreachable!()
            };
            let u_unit = self.unit_of[&update];
            let readers = self.readers(target, &users);
            let pos = |u: usize, v: ValueId| self.units[u].members().iter().position(|m| *m == v);
            // Readers of the original input must run before a write into it: in an
            // earlier unit, or (`limit`) earlier in the same kernel's stage order.
            let before = |unit: usize, limit: Option<usize>, strict: bool| {
                readers.iter().all(|r| {
                    let ru = self.unit_of.get(r).copied().unwrap_or(0);
                    ru < unit
                        || (!strict
                            && ru == unit
                            && match (limit, pos(unit, *r)) {
                                (Some(l), Some(pr)) => pr < l,
                                _ => true,
                            })
                })
            };
            let value_gathered =
                matches!(p.node(value).op, Op::Collective(Collective::AllGather, _));
            let fused = matches!(self.units[u_unit], Unit::Fused { .. } | Unit::Gathered(_));
            // In a fused all-reduce a gathered value is written after each chunk's
            // computation, and only into blocks this rank does not read.
            let update_limit = if fused && value_gathered {
                None
            } else {
                pos(u_unit, update)
            };
            if !before(u_unit, update_limit, false) {
                commits.push((target, update));
                continue;
            }
            storage.insert(update, Storage::Input(target));
            // The producer of the value may write the input directly.
            let v_unit = self.unit_of.get(&value).copied();
            let only_user = users[&value].len() == 1 && !self.kept(value);
            let same_layout = p.node(value).ty.layout == node_layout(p, target);
            if let Some(vu) = v_unit
                && only_user
                && same_layout
                && !storage.contains_key(&value)
            {
                let ok = if vu == u_unit {
                    let limit = if fused && value_gathered {
                        None
                    } else {
                        pos(vu, value)
                    };
                    before(vu, limit, false)
                } else {
                    matches!(self.units[vu], Unit::Op(_)) && before(vu, None, true)
                };
                if ok {
                    storage.insert(value, Storage::Input(target));
                    if vu != u_unit {
                        elided.insert(update);
                    }
                }
            }
        }
        for id in p.ids() {
            if storage.contains_key(&id) {
                continue;
            }
            let unit = self.unit_of[&id];
            let in_kernel = !matches!(self.units[unit], Unit::Op(_));
            // A reduction's result is written once, after the pass (a scalar in memory).
            let escapes = self.kept(id)
                || matches!(p.node(id).op, Op::ReduceAll(..))
                || users.get(&id).is_some_and(|us| {
                    us.iter().any(|u| {
                        self.producer(*u) != Some(unit) || matches!(p.node(*u).op, Op::Scatter(..))
                    })
                })
                || commits.iter().any(|&(_, u)| u == id);
            // Collectives read and write through memory (peers access it) — except inside
            // a fused all-reduce, whose reduced chunk and gathered results pass through
            // registers (the all-gather writes peers' memory from them).
            let fused_head = matches!(self.units[unit], Unit::Fused { rs, .. } if rs == id);
            let communicates = (p.node(id).op.is_communication() && !fused_head)
                || users.get(&id).is_some_and(|us| {
                    us.iter().any(|u| {
                        p.node(*u).op.is_communication()
                            && !(matches!(self.units[unit], Unit::Fused { .. } | Unit::Gathered(_))
                                && matches!(
                                    p.node(*u).op,
                                    Op::Collective(Collective::AllGather, _)
                                )
                                && self.producer(*u) == Some(unit))
                    })
                });
            let s = if in_kernel && !escapes && !communicates {
                Storage::Register
            } else {
                Storage::Slot(usize::MAX)
            };
            storage.insert(id, s);
        }
        (storage, commits, elided)
    }

    /// Elements of `v` on world rank `r` (0 outside its group).
    fn elements(&self, v: ValueId, r: usize) -> usize {
        let node = self.p.node(v);
        let q = self.group_size;
        let holds = match node.ty.placement {
            Placement::Everywhere => true,
            Placement::Group(g) => r / q == g,
        };
        if !holds {
            return 0;
        }
        let mut s = self.shapes[&v].clone();
        if let Layout::Sliced(d) = node.ty.layout {
            s[d] = block_range(s[d], q, r % q).len();
        }
        s.iter().product()
    }

    /// Whether `v` must be in memory at the end of a run: an output, or observed.
    fn kept(&self, v: ValueId) -> bool {
        self.p.outputs().contains(&v) || self.observed.contains(&v)
    }

    /// Assigns slots with liveness-based reuse; also says which value's memory a later
    /// value took over (so that reading the earlier one after a run is refused).
    fn slots(
        &self,
        storage: &HashMap<ValueId, Storage>,
        commits: &[(ValueId, ValueId)],
    ) -> (
        HashMap<ValueId, Storage>,
        Vec<Slot>,
        HashMap<ValueId, ValueId>,
    ) {
        let p = self.p;
        let end = self.units.len();
        let mut last: HashMap<ValueId, usize> = HashMap::new();
        for id in p.ids() {
            for o in p.node(id).op.operands() {
                let mut o = o;
                // A view keeps the viewed value alive.
                while let Some(Storage::View { of, .. }) = storage.get(&o) {
                    o = *of;
                }
                if let Some(u) = self.producer(id) {
                    let e = last.entry(o).or_insert(u);
                    *e = (*e).max(u);
                } else if let Some(e) = last.get_mut(&o) {
                    *e = end;
                }
            }
        }
        for o in p.ids().filter(|&v| self.kept(v)) {
            let mut o = o;
            while let Some(Storage::View { of, .. }) = storage.get(&o) {
                o = *of;
            }
            last.insert(o, end);
        }
        for &(_, u) in commits {
            last.insert(u, end);
        }
        let mut storage = storage.clone();
        let mut slots: Vec<Slot> = Vec::new();
        let mut free: Vec<usize> = Vec::new();
        let mut live: Vec<(usize, usize)> = Vec::new(); // (slot, last use)
        let mut occupants: Vec<Vec<ValueId>> = Vec::new();
        let mut overwritten = HashMap::new();
        let defs: Vec<(usize, ValueId)> = p
            .ids()
            .filter(|v| matches!(storage.get(v), Some(Storage::Slot(_))))
            .map(|v| (self.unit_of[&v], v))
            .collect();
        let mut defs = defs;
        defs.sort_by_key(|&(u, _)| u);
        for (unit, v) in defs {
            // Free slots whose values died before this unit.
            live.retain(|&(s, l)| {
                if l < unit {
                    free.push(s);
                    false
                } else {
                    true
                }
            });
            let want = Slot {
                dtype: p.node(v).ty.dtype,
                elements: (0..self.ranks).map(|r| self.elements(v, r)).collect(),
            };
            let reuse = free.iter().position(|&s| slots[s] == want);
            let s = match reuse {
                Some(i) => free.swap_remove(i),
                None => {
                    slots.push(want);
                    occupants.push(Vec::new());
                    slots.len() - 1
                }
            };
            for earlier in occupants[s].drain(..) {
                overwritten.insert(earlier, v);
            }
            occupants[s].push(v);
            live.push((s, last.get(&v).copied().unwrap_or(unit)));
            storage.insert(v, Storage::Slot(s));
        }
        (storage, slots, overwritten)
    }
}

fn node_layout(p: &Program, v: ValueId) -> Layout {
    p.node(v).ty.layout
}

impl Plan {
    /// Lowers `schedule` for `ranks` ranks with the given dims.
    pub fn lower(
        schedule: &Schedule,
        ranks: usize,
        dims: &BTreeMap<String, usize>,
    ) -> Result<Plan, crate::RuntimeError> {
        lower(schedule, ranks, dims, &[])
    }

    /// [`Plan::lower`], keeping the `observed` values (handles of the scheduled
    /// program, e.g. `p.g1` or a gradient norm) in memory until the end of a run, so
    /// that they can be read afterwards. Other intermediates may share memory with later
    /// values or live only in registers; reading them is refused.
    pub fn lower_observing(
        schedule: &Schedule,
        ranks: usize,
        dims: &BTreeMap<String, usize>,
        observed: &[ValueId],
    ) -> Result<Plan, crate::RuntimeError> {
        lower(schedule, ranks, dims, observed)
    }
}
