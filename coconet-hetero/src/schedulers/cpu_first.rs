//! The CPU-first heuristic: the open-source Paddle heterogeneous parameter server's
//! default split, with the first (input / embedding) layer on a CPU and every other
//! layer on one accelerator type.

use crate::catalog::DeviceClass;
use crate::cost::Problem;
use crate::error::PlanError;

use super::evaluator::Evaluator;
use super::scheduler::{Outcome, Scheduler, SearchConfig};

/// First layer on the cheapest-plan CPU type, the rest on the accelerator type that
/// gives the cheapest plan (tries every CPU × accelerator pair: `T_cpu × T_acc`
/// evaluations). Without a CPU or an accelerator type in the catalogue it falls back
/// to every type for that role.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuFirst;

impl Scheduler for CpuFirst {
    fn name(&self) -> &str {
        "cpu-first"
    }

    fn schedule(&self, pb: &Problem, config: &SearchConfig) -> Result<Outcome, PlanError> {
        let types = &pb.catalog.types;
        let all: Vec<usize> = (0..types.len()).collect();
        let pick = |want_cpu: bool| {
            let v: Vec<usize> = all
                .iter()
                .copied()
                .filter(|&t| (types[t].class == DeviceClass::Cpu) == want_cpu)
                .collect();
            if v.is_empty() { all.clone() } else { v }
        };
        let (cpus, accs) = (pick(true), pick(false));
        let mut ev = Evaluator::new(pb, config);
        let l_n = pb.num_layers();
        'outer: for &c in &cpus {
            for &g in &accs {
                let mut a = vec![g; l_n];
                a[0] = c;
                if ev.cost(&a).is_none() {
                    break 'outer;
                }
            }
        }
        ev.finish(self.name())
    }
}
