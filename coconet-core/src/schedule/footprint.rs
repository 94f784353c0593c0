//! Per-rank memory of a schedule, computed from the program: inputs, optimizer state
//! (updated inputs, written in place) and the peak of live intermediates.

use super::scheduled::Schedule;
use crate::{InterpError, Layout, Op, Placement, ValueId, block_range};
use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// Bytes held by the busiest rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Footprint {
    /// Tensor inputs that are only read (gradients, activations).
    pub inputs: u64,
    /// Tensor inputs that are updated in place (weights, optimizer state).
    pub state: u64,
    /// Peak bytes of materialised intermediates (values inside a fusion group live in
    /// registers; scatters are views; updates write their input in place).
    pub intermediates: u64,
}

impl Footprint {
    /// Everything.
    pub fn total(&self) -> u64 {
        self.inputs + self.state + self.intermediates
    }
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

impl fmt::Display for Footprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "inputs {:.2} MiB + state {:.2} MiB + intermediates {:.2} MiB = {:.2} MiB",
            mib(self.inputs),
            mib(self.state),
            mib(self.intermediates),
            mib(self.total())
        )
    }
}

impl Schedule {
    /// Memory per rank (the busiest one) for the given dims on `ranks` ranks.
    pub fn footprint(
        &self,
        dims: &BTreeMap<String, usize>,
        ranks: usize,
    ) -> Result<Footprint, InterpError> {
        let p = &self.program;
        let groups = p.groups();
        let q = p.group_size(ranks)?;
        let updated: Vec<ValueId> = p.updates().map(|(t, _)| t).collect();
        let ids: Vec<ValueId> = p.ids().collect();
        let mut last_use: HashMap<ValueId, usize> = HashMap::new();
        for (i, &id) in ids.iter().enumerate() {
            for o in p.node(id).op.operands() {
                last_use.insert(o, i);
            }
        }
        for &o in p.outputs() {
            last_use.insert(o, ids.len());
        }
        let mut per_group = vec![Footprint::default(); groups];
        let mut live = vec![0u64; groups];
        let mut frees: Vec<Vec<(usize, u64)>> = vec![Vec::new(); ids.len() + 1];
        for (i, &id) in ids.iter().enumerate() {
            let node = p.node(id);
            let mut shape = node
                .ty
                .shape
                .resolve(dims)
                .map_err(|dim| InterpError::UnboundDim {
                    dim,
                    used_by: p.label(id),
                })?;
            if let Layout::Sliced(d) = node.ty.layout {
                shape[d] = block_range(shape[d], q, 0).len();
            }
            // Checked: a shape whose size wraps would report a small footprint for a
            // plan `Plan::lower` refuses.
            let size = node.ty.dtype.size_bytes();
            let bytes = (crate::interp::checked_size(&p.label(id), &shape, node.ty.dtype, size)?
                * size) as u64;
            let gs: Vec<usize> = match node.ty.placement {
                Placement::Group(g) => vec![g],
                Placement::Everywhere => (0..groups).collect(),
            };
            for g in gs {
                let fp = &mut per_group[g];
                match node.op {
                    Op::TensorInput if updated.contains(&id) => fp.state += bytes,
                    Op::TensorInput => fp.inputs += bytes,
                    Op::ScalarInput | Op::Literal(_) | Op::Scatter(..) | Op::Update { .. } => {}
                    _ if self.register_only(id, &last_use) => {}
                    _ => {
                        live[g] += bytes;
                        fp.intermediates = fp.intermediates.max(live[g]);
                        let end = last_use.get(&id).copied().unwrap_or(i);
                        frees[end.max(i)].push((g, bytes));
                    }
                }
            }
            for &(g, b) in &frees[i] {
                live[g] -= b;
            }
        }
        Ok(per_group
            .into_iter()
            .max_by_key(Footprint::total)
            .unwrap_or_default())
    }

    /// A fused value that only its own group reads, and is not returned.
    fn register_only(&self, id: ValueId, last_use: &HashMap<ValueId, usize>) -> bool {
        let Some(g) = self.fusion_of(id) else {
            return false;
        };
        let p = &self.program;
        if p.outputs().contains(&id) || !last_use.contains_key(&id) {
            return false;
        }
        p.ids()
            .filter(|&u| p.node(u).op.operands().contains(&id))
            .all(|u| self.fusions[g].members.contains(&u))
    }
}
