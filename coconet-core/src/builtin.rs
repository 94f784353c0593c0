//! The builtins of the language: every operation a program writes as a call or an
//! operator, the arguments it takes and how it is built. Declared once, here: the
//! `#[coconet]` macro reads this table to parse calls and to suggest names, and the code
//! it generates builds each call through [`ProgramBuilder::builtin`] — so the check at
//! compile time and the build at run time are the same code, and a new operation is one
//! entry.

use crate::{
    BinaryOp, CheckError, Collective, DType, Direction, ErrorKind, Operand, ProgramBuilder,
    ReduceKind, ReduceOp, UnaryOp, ValueId,
};
use Param::{DType as D, Direction as Dir, Int, OptInt, Reduce, Tensor, Value as V};
use std::sync::LazyLock;

/// How an argument of a builtin is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Param {
    /// A value of the program or a numeric literal.
    Value,
    /// A value of the program, not a literal: what a collective communicates, the input
    /// an update writes.
    Tensor,
    /// A reduction: `Sum`, `Prod`, `Max`, `Min` or `Avg`.
    Reduce,
    /// An integer literal: a dim or a root rank.
    Int,
    /// An integer literal that may be left out (then 0); always last.
    OptInt,
    /// A direction: `Next` or `Prev`.
    Direction,
    /// The result's dtype, written as a turbofish (`cast::<f32>(x)`), not between the
    /// parentheses.
    DType,
}

impl Param {
    /// Whether the argument is an operand of the builder call, which
    /// [`CheckError::at`] counts: values and integers, not reductions, directions or
    /// dtypes.
    pub fn is_operand(self) -> bool {
        matches!(
            self,
            Param::Value | Param::Tensor | Param::Int | Param::OptInt
        )
    }

    /// Whether the argument is written between the parentheses.
    pub fn in_parens(self) -> bool {
        self != Param::DType
    }
}

/// An argument of a builtin call. `V` is how a value is referred to: an [`Operand`] for
/// [`ProgramBuilder::builtin`], a step of its own in the macro.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg<V = Operand> {
    /// For [`Param::Value`] and [`Param::Tensor`].
    Value(V),
    /// For [`Param::Reduce`].
    Reduce(ReduceOp),
    /// For [`Param::Int`] and [`Param::OptInt`].
    Int(usize),
    /// For [`Param::Direction`].
    Direction(Direction),
    /// For [`Param::DType`].
    DType(DType),
}

impl<V> Arg<V> {
    /// The same argument with its value mapped by `f`.
    pub fn map<W>(self, f: impl FnOnce(V) -> W) -> Arg<W> {
        match self {
            Arg::Value(v) => Arg::Value(f(v)),
            Arg::Reduce(o) => Arg::Reduce(o),
            Arg::Int(i) => Arg::Int(i),
            Arg::Direction(d) => Arg::Direction(d),
            Arg::DType(d) => Arg::DType(d),
        }
    }
}

/// `From` each argument's type, so that a call reads `&[ReduceOp::Sum.into(), x.into()]`.
macro_rules! arg_from {
    ($($t:ty => $make:expr),* $(,)?) => {$(
        impl From<$t> for Arg {
            fn from(x: $t) -> Arg {
                $make(x)
            }
        }
    )*};
}

arg_from! {
    Operand => Arg::Value,
    ValueId => |v: ValueId| Arg::Value(Operand::Value(v)),
    ReduceOp => Arg::Reduce,
    usize => Arg::Int,
    Direction => Arg::Direction,
    DType => Arg::DType,
}

/// How a builtin adds its node: families share one builder method, the rest have a
/// function of their own.
#[derive(Clone, Copy)]
enum Build {
    Unary(UnaryOp),
    Binary(BinaryOp),
    ReduceAll(ReduceKind),
    Call(fn(&mut ProgramBuilder, &Args<'_>) -> Result<ValueId, CheckError>),
}

/// One operation of the language.
#[derive(Clone, Copy)]
pub struct Builtin {
    /// Its name: what a program calls (`all_reduce`), or the op behind an operator
    /// (`add` for `+`).
    pub name: &'static str,
    /// Its arguments, in the order they are written.
    pub params: &'static [Param],
    /// How a call is written after the name, for error messages: `(op, x)`.
    pub usage: &'static str,
    /// Whether it is written only as an operator (`a + b`), never called by name.
    pub operator: bool,
    build: Build,
}

impl std::fmt::Debug for Builtin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Builtin({}{})", self.name, self.usage)
    }
}

/// A builtin with a function of its own.
const fn call(
    name: &'static str,
    params: &'static [Param],
    usage: &'static str,
    f: fn(&mut ProgramBuilder, &Args<'_>) -> Result<ValueId, CheckError>,
) -> Builtin {
    Builtin {
        name,
        params,
        usage,
        operator: false,
        build: Build::Call(f),
    }
}

/// A callable binary op.
const fn binary(op: BinaryOp, name: &'static str) -> Builtin {
    Builtin {
        name,
        params: &[V, V],
        usage: "(a, b)",
        operator: false,
        build: Build::Binary(op),
    }
}

/// How a program calls collective `c` (its parameters are the call's arguments). An
/// exhaustive match: a new collective is a compile error here until it has a spelling.
fn collective(c: Collective) -> Builtin {
    let name = c.name();
    match c {
        Collective::AllReduce(_) => call(name, &[Reduce, Tensor], "(op, x)", |b, a| {
            b.all_reduce(a.reduce(0)?, a.tensor(1)?)
        }),
        Collective::ReduceScatter(..) => call(
            name,
            &[Reduce, Tensor, OptInt],
            "(op, x) or (op, x, dim)",
            |b, a| b.reduce_scatter(a.reduce(0)?, a.tensor(1)?, a.int(2)?),
        ),
        Collective::AllGather => call(name, &[Tensor], "(x)", |b, a| b.all_gather(a.tensor(0)?)),
        Collective::Broadcast(_) => call(name, &[Tensor, Int], "(x, root)", |b, a| {
            b.broadcast(a.tensor(0)?, a.int(1)?)
        }),
        Collective::Reduce(..) => call(name, &[Reduce, Tensor, Int], "(op, x, root)", |b, a| {
            b.reduce(a.reduce(0)?, a.tensor(1)?, a.int(2)?)
        }),
        Collective::Send(_) => call(name, &[Tensor, Dir], "(x, Next | Prev)", |b, a| {
            b.send(a.tensor(0)?, a.direction(1)?)
        }),
    }
}

/// Every builtin; callable names in the order suggestions prefer them (the collectives
/// first, one entry for each of [`Collective::ALL`]).
static TABLE: LazyLock<Vec<Builtin>> = LazyLock::new(|| {
    let mut t: Vec<Builtin> = Collective::ALL.map(collective).into();
    t.extend([
        call("scatter", &[Tensor, OptInt], "(x) or (x, dim)", |b, a| {
            b.scatter(a.tensor(0)?, a.int(1)?)
        }),
        call("update", &[Tensor, V], "(input, value)", |b, a| {
            b.update(a.tensor(0)?, a.value(1)?)
        }),
        call("matmul", &[V, V], "(a, b)", |b, a| {
            b.matmul(a.value(0)?, a.value(1)?)
        }),
        call("select", &[V, V, V], "(cond, a, b)", |b, a| {
            b.select(a.value(0)?, a.value(1)?, a.value(2)?)
        }),
        call("cast", &[D, V], "::<dtype>(x)", |b, a| {
            b.cast(a.dtype(0)?, a.value(1)?)
        }),
        call("dropout", &[V, V, V], "(x, p, seed)", |b, a| {
            b.dropout(a.value(0)?, a.value(1)?, a.value(2)?)
        }),
        call(
            "layer_norm",
            &[V, V, V, V],
            "(x, gamma, beta, eps)",
            |b, a| b.layer_norm(a.value(0)?, a.value(1)?, a.value(2)?, a.value(3)?),
        ),
        binary(BinaryOp::Pow, "pow"),
        binary(BinaryOp::Min, "min"),
        binary(BinaryOp::Max, "max"),
    ]);
    t.extend(ReduceKind::ALL.map(|k| Builtin {
        name: k.name(),
        params: &[V],
        usage: "(x)",
        operator: false,
        build: Build::ReduceAll(k),
    }));
    t.extend(UnaryOp::ALL.map(|u| Builtin {
        name: u.name(),
        params: &[V],
        usage: "(x)",
        operator: false,
        build: Build::Unary(u),
    }));
    let operators: Vec<Builtin> = BinaryOp::ALL
        .into_iter()
        .filter(|op| !t.iter().any(|b| b.name == op.name()))
        .map(|op| Builtin {
            name: op.name(),
            params: &[V, V],
            usage: "(a, b)",
            operator: true,
            build: Build::Binary(op),
        })
        .collect();
    t.extend(operators);
    t
});

impl Builtin {
    /// Every builtin.
    pub fn all() -> &'static [Builtin] {
        &TABLE
    }

    /// The builtin named `name`, operators included.
    pub fn named(name: &str) -> Option<&'static Builtin> {
        Builtin::all().iter().find(|b| b.name == name)
    }

    /// The builtin a program calls as `name(..)` (not an operator's op).
    pub fn callable(name: &str) -> Option<&'static Builtin> {
        Builtin::named(name).filter(|b| !b.operator)
    }

    /// The names a program calls, in the order suggestions prefer them.
    pub fn callable_names() -> impl Iterator<Item = &'static str> {
        Builtin::all()
            .iter()
            .filter(|b| !b.operator)
            .map(|b| b.name)
    }

    /// The builtin of an operator's op (`+` is [`BinaryOp::Add`]).
    pub fn of_binary(op: BinaryOp) -> &'static Builtin {
        Builtin::named(op.name()).expect("every binary op is in the table")
    }

    /// The builtin of a unary op (`-x` is [`UnaryOp::Neg`]).
    pub fn of_unary(op: UnaryOp) -> &'static Builtin {
        Builtin::named(op.name()).expect("every unary op is in the table")
    }

    /// The constant a call with these literal values folds to, for the ops a program may
    /// apply to constants (unary and binary arithmetic); `None` for the others, which
    /// need a tensor. Binary ops fold as floating-point (a literal's dtype is not known).
    pub fn fold(&self, literals: &[f64]) -> Option<f64> {
        match (self.build, literals) {
            (Build::Unary(u), &[x]) => Some(u.eval(x)),
            (Build::Binary(op), &[a, b]) => Some(op.eval(a, b, false)),
            _ => None,
        }
    }

    /// How many arguments are written between the parentheses: at least, at most.
    pub fn arity(&self) -> (usize, usize) {
        let written = self.params.iter().filter(|p| p.in_parens());
        let most = written.clone().count();
        (written.filter(|p| **p != OptInt).count(), most)
    }

    /// Why `got` arguments between the parentheses are wrong, if they are.
    pub fn arity_error(&self, got: usize) -> Option<String> {
        let (least, most) = self.arity();
        if (least..=most).contains(&got) {
            return None;
        }
        let count = if least == most {
            format!("{least}")
        } else {
            format!("{least} or {most}")
        };
        let (name, usage) = (self.name, self.usage);
        Some(format!(
            "`{name}` takes {count} argument(s), as in `{name}{usage}`; got {got}"
        ))
    }

    /// Adds the call to `b`, after checking the arguments against [`Builtin::params`].
    pub fn build(&self, b: &mut ProgramBuilder, args: &[Arg]) -> Result<ValueId, CheckError> {
        let written = args.iter().filter(|a| !matches!(a, Arg::DType(_))).count();
        if let Some(message) = self.arity_error(written) {
            return Err(CheckError::new(ErrorKind::Usage, message));
        }
        let a = Args {
            builtin: self,
            args,
        };
        match self.build {
            Build::Unary(u) => b.unary(u, a.value(0)?),
            Build::Binary(op) => b.binary(op, a.value(0)?, a.value(1)?),
            Build::ReduceAll(k) => b.reduce_all(k, a.value(0)?),
            Build::Call(f) => f(b, &a),
        }
    }
}

/// The arguments of one call, read by position with the kind the table declares.
struct Args<'a> {
    builtin: &'a Builtin,
    args: &'a [Arg],
}

impl Args<'_> {
    /// The operand index of argument `i`, which errors point at.
    fn operand(&self, i: usize) -> usize {
        self.builtin.params[..i]
            .iter()
            .filter(|p| p.is_operand())
            .count()
    }

    fn wrong(&self, i: usize, what: &str) -> CheckError {
        CheckError::new(
            ErrorKind::Usage,
            format!(
                "argument {} of `{}` must be {what}",
                i + 1,
                self.builtin.name
            ),
        )
        .at(self.operand(i))
    }

    fn value(&self, i: usize) -> Result<Operand, CheckError> {
        match self.args.get(i) {
            Some(Arg::Value(v)) => Ok(*v),
            _ => Err(self.wrong(i, "a value")),
        }
    }

    fn tensor(&self, i: usize) -> Result<ValueId, CheckError> {
        match self.args.get(i) {
            Some(Arg::Value(Operand::Value(v))) => Ok(*v),
            Some(Arg::Value(Operand::Lit(_))) => Err(CheckError::new(
                ErrorKind::Usage,
                format!(
                    "`{}` needs a tensor here, not a constant",
                    self.builtin.name
                ),
            )
            .at(self.operand(i))),
            _ => Err(self.wrong(i, "a value")),
        }
    }

    fn reduce(&self, i: usize) -> Result<ReduceOp, CheckError> {
        match self.args.get(i) {
            Some(Arg::Reduce(o)) => Ok(*o),
            _ => Err(self.wrong(i, "a reduction")),
        }
    }

    /// An integer; a left-out optional one is 0.
    fn int(&self, i: usize) -> Result<usize, CheckError> {
        match self.args.get(i) {
            Some(Arg::Int(x)) => Ok(*x),
            None if self.builtin.params.get(i) == Some(&OptInt) => Ok(0),
            _ => Err(self.wrong(i, "an integer")),
        }
    }

    fn direction(&self, i: usize) -> Result<Direction, CheckError> {
        match self.args.get(i) {
            Some(Arg::Direction(d)) => Ok(*d),
            _ => Err(self.wrong(i, "a direction")),
        }
    }

    fn dtype(&self, i: usize) -> Result<DType, CheckError> {
        match self.args.get(i) {
            Some(Arg::DType(d)) => Ok(*d),
            _ => Err(self.wrong(i, "a dtype")),
        }
    }
}

impl ProgramBuilder {
    /// Adds a call of the builtin `name` (see [`Builtin`]): the one entry point the
    /// `#[coconet]` macro's generated code uses.
    ///
    /// ```
    /// use coconet_core::*;
    /// let mut b = ProgramBuilder::new("p");
    /// let n = Shape::new(vec![Dim::sym("N")]);
    /// let g = b.tensor_input("g", DType::F32, Layout::Local, n, 0).unwrap();
    /// let s = b.builtin("all_reduce", &[ReduceOp::Sum.into(), g.into()]);
    /// assert_eq!(b.ty(s.unwrap()).layout, Layout::Replicated);
    /// assert!(b.builtin("all_reduse", &[]).is_err());
    /// ```
    pub fn builtin(&mut self, name: &str, args: &[Arg]) -> Result<ValueId, CheckError> {
        match Builtin::named(name) {
            Some(builtin) => builtin.build(self, args),
            None => Err(CheckError::new(
                ErrorKind::Usage,
                format!("unknown operation `{name}`"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every op of the families and every collective is in the table under its own
    /// name, once.
    #[test]
    fn the_table_names_every_op_once() {
        let names: Vec<&str> = Builtin::all().iter().map(|b| b.name).collect();
        let ops = UnaryOp::ALL.map(UnaryOp::name).into_iter();
        let ops = ops
            .chain(BinaryOp::ALL.map(BinaryOp::name))
            .chain(ReduceKind::ALL.map(ReduceKind::name))
            .chain(Collective::ALL.map(Collective::name));
        for op in ops {
            assert_eq!(names.iter().filter(|n| **n == op).count(), 1, "{op}");
        }
        let mut unique = names.clone();
        unique.dedup();
        assert_eq!(unique.len(), names.len());
        assert!(Builtin::callable("pow").is_some() && Builtin::callable("add").is_none());
    }

    /// The arity message counts only what is written between the parentheses.
    #[test]
    fn arity_counts_the_parenthesised_arguments() {
        let cast = Builtin::callable("cast").expect("cast");
        assert_eq!(cast.arity(), (1, 1));
        let rs = Builtin::callable("reduce_scatter").expect("reduce_scatter");
        assert_eq!(rs.arity(), (2, 3));
        assert_eq!(
            rs.arity_error(1).as_deref(),
            Some(
                "`reduce_scatter` takes 2 or 3 argument(s), as in `reduce_scatter(op, x) or (op, x, dim)`; got 1"
            )
        );
    }
}
