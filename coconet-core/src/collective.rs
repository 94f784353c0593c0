//! The collectives: communication within a process group (and, for `send`, between
//! neighbouring groups). Declared once, here, with what each does to its operand's type
//! (the layout rules the checker applies) and how it is named and printed. A new
//! collective is a variant here; the compiler then names every other place that must
//! say what it does: its line in [`Collective::ALL`], its spelling in the builtin table,
//! the reference interpreter, each backend and the cost model.

use crate::builder::err;
use crate::{
    CheckError, DType, Direction, ErrorKind, Layout, Op, Placement, ProgramBuilder, ReduceOp,
    ValueId, ValueType,
};

/// A collective, with its parameters; its operand is the [`Op::Collective`]'s value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Collective {
    /// Reduce over the group; every rank gets the result (Replicated).
    AllReduce(ReduceOp),
    /// Reduce over the group; rank r keeps block r along the dim (Sliced(dim)).
    ReduceScatter(ReduceOp, usize),
    /// Concatenate the blocks of a Sliced value on every rank (Replicated).
    AllGather,
    /// Every rank gets the value of rank `root` of the group (Replicated).
    Broadcast(usize),
    /// Rank `root` gets the reduction; the other ranks keep their input unchanged
    /// (Local).
    Reduce(ReduceOp, usize),
    /// Rank i of group g sends its value to rank i of the neighbouring group.
    Send(Direction),
}

impl Collective {
    /// Its name, as a program calls it (`all_reduce`).
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce(_) => "all_reduce",
            Collective::ReduceScatter(..) => "reduce_scatter",
            Collective::AllGather => "all_gather",
            Collective::Broadcast(_) => "broadcast",
            Collective::Reduce(..) => "reduce",
            Collective::Send(_) => "send",
        }
    }

    /// The rank of the group that the collective is rooted at, if it is.
    pub fn root(self) -> Option<usize> {
        match self {
            Collective::Broadcast(root) | Collective::Reduce(_, root) => Some(root),
            Collective::AllReduce(_)
            | Collective::ReduceScatter(..)
            | Collective::AllGather
            | Collective::Send(_) => None,
        }
    }

    /// The arguments as printed around the operand `x` (`Sum, g, dim=0`).
    pub fn print_args(self, x: &str) -> String {
        match self {
            Collective::AllReduce(op) => format!("{op}, {x}"),
            Collective::ReduceScatter(op, d) => format!("{op}, {x}, dim={d}"),
            Collective::AllGather => x.to_string(),
            Collective::Broadcast(root) => format!("{x}, root={root}"),
            Collective::Reduce(op, root) => format!("{op}, {x}, root={root}"),
            Collective::Send(dir) => format!("{x}, {}", dir.name()),
        }
    }
}

/// Declares [`Collective::ALL`] from lines `pattern => one of its values`: the patterns
/// form an exhaustive match, so a new variant is a compile error here until it has a
/// line, and with it a place in `ALL` (and so in the builtin table); each value is
/// checked against its line's pattern.
macro_rules! one_of_each {
    ($($pattern:pat => $value:expr),* $(,)?) => {
        impl Collective {
            /// One of each collective (its parameters at their first values), in the
            /// order the builtin table lists them.
            pub const ALL: [Collective; [$(stringify!($value)),*].len()] = [$($value),*];
        }

        // Every variant has a line.
        const _: fn(Collective) = |c| match c {
            $($pattern => {})*
        };

        // Each value is of its line's variant.
        const _: () = {
            let mut i = 0;
            $(
                assert!(matches!(Collective::ALL[i], $pattern));
                i += 1;
            )*
            assert!(i == Collective::ALL.len());
        };
    };
}

one_of_each! {
    Collective::AllReduce(_) => Collective::AllReduce(ReduceOp::Sum),
    Collective::ReduceScatter(..) => Collective::ReduceScatter(ReduceOp::Sum, 0),
    Collective::AllGather => Collective::AllGather,
    Collective::Broadcast(_) => Collective::Broadcast(0),
    Collective::Reduce(..) => Collective::Reduce(ReduceOp::Sum, 0),
    Collective::Send(_) => Collective::Send(Direction::Next),
}

impl ProgramBuilder {
    /// Adds collective `c` of `x`, with the layout rules of [`ProgramBuilder`]'s table:
    /// the one place they are stated for collectives.
    pub fn collective(&mut self, c: Collective, x: ValueId) -> Result<ValueId, CheckError> {
        let name = c.name();
        let t = match c {
            Collective::AllReduce(_) | Collective::Broadcast(_) => ValueType {
                layout: Layout::Replicated,
                ..self.collective_operand(name, x, false)?
            },
            Collective::ReduceScatter(_, dim) => {
                let t = self.collective_operand(name, x, false)?;
                self.check_dim(name, &t, dim, 1)?;
                ValueType {
                    layout: Layout::Sliced(dim),
                    ..t
                }
            }
            Collective::AllGather => {
                let t = self.collective_operand(name, x, true)?;
                if !matches!(t.layout, Layout::Sliced(_)) {
                    return Err(err(
                        ErrorKind::Layout,
                        format!(
                            "layout mismatch: `all_gather` needs a Sliced operand, but `{}` is {}",
                            self.program().label(x),
                            t.layout
                        ),
                    )
                    .at(0));
                }
                ValueType {
                    layout: Layout::Replicated,
                    ..t
                }
            }
            Collective::Reduce(..) => ValueType {
                layout: Layout::Local,
                ..self.collective_operand(name, x, false)?
            },
            Collective::Send(dir) => self.send_operand(x, dir)?,
        };
        Ok(self.push(Op::Collective(c, x), t))
    }

    /// Reduce over the group; the result is Replicated.
    pub fn all_reduce(&mut self, op: ReduceOp, x: ValueId) -> Result<ValueId, CheckError> {
        self.collective(Collective::AllReduce(op), x)
    }

    /// Reduce over the group and keep block r along `dim` on rank r (Sliced(dim)).
    pub fn reduce_scatter(
        &mut self,
        op: ReduceOp,
        x: ValueId,
        dim: usize,
    ) -> Result<ValueId, CheckError> {
        self.collective(Collective::ReduceScatter(op, dim), x)
    }

    /// Gathers a Sliced value on every rank (Replicated).
    pub fn all_gather(&mut self, x: ValueId) -> Result<ValueId, CheckError> {
        self.collective(Collective::AllGather, x)
    }

    /// Every rank gets rank `root`'s value (Replicated).
    pub fn broadcast(&mut self, x: ValueId, root: usize) -> Result<ValueId, CheckError> {
        self.collective(Collective::Broadcast(root), x)
    }

    /// Rank `root` gets the reduction, the others keep their input unchanged: the
    /// result is Local (a different value per rank), and only rank `root`'s value is the
    /// reduction.
    pub fn reduce(&mut self, op: ReduceOp, x: ValueId, root: usize) -> Result<ValueId, CheckError> {
        self.collective(Collective::Reduce(op, root), x)
    }

    /// Sends the value to the neighbouring group, rank i to rank i.
    pub fn send(&mut self, x: ValueId, dir: Direction) -> Result<ValueId, CheckError> {
        self.collective(Collective::Send(dir), x)
    }

    /// Checks a collective's operand; returns its type with the group it acts in.
    fn collective_operand(
        &self,
        op: &str,
        x: ValueId,
        allow_sliced: bool,
    ) -> Result<ValueType, CheckError> {
        self.check_id(x)?;
        let mut t = self.ty(x).clone();
        self.require(op, x, 0, DType::is_numeric, "numeric")?;
        if t.placement == Placement::Everywhere {
            if self.program().groups() == 1 {
                t.placement = Placement::Group(0);
            } else {
                return Err(err(
                    ErrorKind::Group,
                    format!(
                        "`{op}` of `{}`, which is held by every group; a collective acts within one group",
                        self.program().label(x)
                    ),
                ));
            }
        }
        if !allow_sliced && matches!(t.layout, Layout::Sliced(_)) {
            return Err(err(
                ErrorKind::Layout,
                format!(
                    "layout mismatch: `{op}` needs a Local or Replicated operand, but `{}` is {}{}",
                    self.program().label(x),
                    t.layout,
                    if op == "all_reduce" {
                        "; to replicate a Sliced value use all_gather"
                    } else {
                        ""
                    }
                ),
            )
            .at(0));
        }
        Ok(t)
    }

    /// Checks a send's operand; returns its type placed in the group it goes to.
    fn send_operand(&self, x: ValueId, dir: Direction) -> Result<ValueType, CheckError> {
        self.check_id(x)?;
        let mut t = self.ty(x).clone();
        let g = match t.placement {
            Placement::Group(g) => g,
            Placement::Everywhere => {
                return Err(err(
                    ErrorKind::Group,
                    format!(
                        "`send` of `{}`, which every group already holds",
                        self.program().label(x)
                    ),
                )
                .at(0));
            }
        };
        let to = match dir {
            Direction::Next => g + 1,
            Direction::Prev => g.wrapping_sub(1),
        };
        let groups = self.program().groups();
        if to >= groups {
            return Err(err(
                ErrorKind::Group,
                format!(
                    "`send({}, {})` from group {g}: there is no such group (the program has {groups} group(s); \
                     set them with #[coconet(groups = G)])",
                    self.program().label(x),
                    dir.name(),
                ),
            ));
        }
        t.placement = Placement::Group(to);
        Ok(t)
    }
}
