//! `split`: an all-reduce is a reduce-scatter followed by an all-gather (or a reduce
//! followed by a broadcast).

use super::error::ScheduleError;
use super::rewrite::Rewrite;
use super::scheduled::Schedule;
use crate::Collective;
use crate::{CheckError, Op, ProgramBuilder, ReduceOp, ValueId};

const T: &str = "split";

impl Schedule {
    /// Splits all-reduce `ar` into `reduce_scatter` (along dim 0) and `all_gather`;
    /// returns `(rs, ag)`. The all-gather keeps `ar`'s id and name (it is the same
    /// Replicated value); the reduce-scatter is named `<ar>_rs`.
    pub fn split(&mut self, ar: impl Into<ValueId>) -> Result<(ValueId, ValueId), ScheduleError> {
        self.split_along(ar, 0)
    }

    /// [`Schedule::split`] with the reduce-scatter along `dim`.
    pub fn split_along(
        &mut self,
        ar: impl Into<ValueId>,
        dim: usize,
    ) -> Result<(ValueId, ValueId), ScheduleError> {
        let ar = self.stage(T, ar)?;
        let shape = &self.program.node(ar).ty.shape;
        if dim >= shape.rank() {
            return Err(ScheduleError::new(
                T,
                format!(
                    "{} has shape {shape}: it cannot be reduce-scattered along dim {dim}",
                    self.label(ar)
                ),
            ));
        }
        self.split_with(ar, "rs", "all_gather", |b, op, x, name| {
            let rs = b.reduce_scatter(op, x, dim)?;
            b.bind(rs, name)?;
            Ok((rs, Box::new(move |b: &mut ProgramBuilder| b.all_gather(rs))))
        })
    }

    /// Splits all-reduce `ar` into `reduce` to rank `root` and `broadcast` from it;
    /// returns `(reduce, broadcast)`. The broadcast keeps `ar`'s id and name.
    pub fn split_reduce_broadcast(
        &mut self,
        ar: impl Into<ValueId>,
        root: usize,
    ) -> Result<(ValueId, ValueId), ScheduleError> {
        let ar = self.stage(T, ar)?;
        self.split_with(ar, "reduce", "broadcast", |b, op, x, name| {
            let r = b.reduce(op, x, root)?;
            b.bind(r, name)?;
            Ok((
                r,
                Box::new(move |b: &mut ProgramBuilder| b.broadcast(r, root)),
            ))
        })
    }

    /// Replaces `ar` by `first` (named `<ar>_<suffix>`, made by `make`) and the second
    /// collective that `make` returns, which takes over `ar`'s id and name.
    fn split_with(
        &mut self,
        ar: ValueId,
        suffix: &str,
        second: &str,
        make: impl FnOnce(
            &mut ProgramBuilder,
            ReduceOp,
            ValueId,
            &str,
        ) -> Result<(ValueId, Second), CheckError>,
    ) -> Result<(ValueId, ValueId), ScheduleError> {
        self.before_annotations(T)?;
        let node = self.program.node(ar);
        let Op::Collective(Collective::AllReduce(op), x) = node.op else {
            return Err(ScheduleError::new(
                T,
                format!(
                    "{} is {}, not an all_reduce",
                    self.label(ar),
                    super::error::article(node.op.name())
                ),
            ));
        };
        let name = self.program.label(ar);
        let first_name = format!("{name}_{suffix}");
        let check = |e| ScheduleError::check(T, e);
        let mut rw = Rewrite::new(&self.program);
        let mut make = Some(make);
        let mut first = None;
        for id in self.program.ids() {
            if id != ar {
                rw.copy(id).map_err(check)?;
                continue;
            }
            let make = make.take().expect("ar appears once");
            let x = rw.get(x);
            let (f, then) = make(&mut rw.b, op, x, &first_name).map_err(check)?;
            rw.b.reuse_id(ar).map_err(check)?;
            let s = then(&mut rw.b).map_err(check)?;
            rw.b.bind(s, &name).map_err(check)?;
            rw.map.insert(ar, s);
            first = Some(f);
        }
        let program = rw.finish().map_err(check)?;
        self.replace(
            program,
            format!("split({name}) -> {first_name}, {second} {name}"),
        );
        Ok((first.expect("ar is in the program"), ar))
    }
}

/// The second collective of a split, added after the first.
type Second = Box<dyn FnOnce(&mut ProgramBuilder) -> Result<ValueId, CheckError>>;
