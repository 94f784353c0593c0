//! Dead-code elimination: drop values that no output or update depends on.

use super::error::ScheduleError;
use super::rewrite::Rewrite;
use super::scheduled::Schedule;
use crate::Op;
use std::collections::BTreeSet;

impl Schedule {
    /// Removes every stage that no output or update depends on (inputs stay: they are
    /// the program's interface). Returns how many values were removed.
    pub fn eliminate_dead_code(&mut self) -> Result<usize, ScheduleError> {
        const T: &str = "eliminate_dead_code";
        self.before_annotations(T)?;
        let p = &self.program;
        let mut live: BTreeSet<_> = p.outputs().iter().copied().collect();
        live.extend(p.updates().map(|(_, u)| u));
        let ids: Vec<_> = p.ids().collect();
        for &id in ids.iter().rev() {
            let node = p.node(id);
            if matches!(node.op, Op::TensorInput | Op::ScalarInput) {
                live.insert(id);
            }
            if live.contains(&id) {
                live.extend(node.op.operands());
            }
        }
        let removed = ids.len() - live.len();
        if removed == 0 {
            return Ok(0);
        }
        let mut rw = Rewrite::new(p);
        for id in ids.into_iter().filter(|id| live.contains(id)) {
            rw.copy(id).map_err(|e| ScheduleError::check(T, e))?;
        }
        let program = rw.finish().map_err(|e| ScheduleError::check(T, e))?;
        self.replace(program, format!("eliminate_dead_code() removed {removed}"));
        Ok(removed)
    }
}
