//! Lowering the function body to builder calls, running each through the checker as it
//! goes. Every error is collected with the span of the offending tokens; a failed
//! expression yields a poisoned value so later uses do not pile up follow-on errors.

use crate::signature::{self, Options, ParamKind};
use crate::suggest;
use coconet_core::{
    BinaryOp, CheckError, DType, Dim, Direction, Layout, Operand, ProgramBuilder, ReduceKind,
    ReduceOp, Shape, UnaryOp, ValueId,
};
use proc_macro2::{Ident, Span, TokenStream};
use quote::ToTokens;
use quote::format_ident;
use std::collections::HashMap;
use syn::{Error, Expr, Stmt};

/// An operand of a lowered call: an earlier step or a literal.
#[derive(Clone, Copy)]
pub enum Arg {
    /// The value of step `i`.
    Step(usize),
    /// A constant.
    Lit(f64),
}

/// One builder call (mirrors the `ProgramBuilder` methods).
pub enum Call {
    TensorInput {
        name: String,
        dtype: DType,
        layout: Layout,
        shape: Shape,
        group: usize,
    },
    ScalarInput {
        name: String,
        dtype: DType,
    },
    Unary(UnaryOp, Arg),
    Binary(BinaryOp, Arg, Arg),
    Select(Arg, Arg, Arg),
    Cast(DType, Arg),
    Dropout(Arg, Arg, Arg),
    MatMul(Arg, Arg),
    ReduceAll(ReduceKind, Arg),
    LayerNorm(Arg, Arg, Arg, Arg),
    AllReduce(ReduceOp, usize),
    ReduceScatter(ReduceOp, usize, usize),
    AllGather(usize),
    Broadcast(usize, usize),
    Reduce(ReduceOp, usize, usize),
    Scatter(usize, usize),
    Send(usize, Direction),
    Update(usize, Arg),
}

/// A lowered step: the local variable the generated code binds, and its call.
pub struct Step {
    pub var: Ident,
    pub call: Call,
    /// The user's name for the value (`let name = ...` or a parameter).
    pub bind: Option<Ident>,
    /// Element type (for the typed handle).
    pub dtype: DType,
    /// Printed type, for generated docs.
    pub doc: String,
}

/// The checked function.
pub struct Lowered {
    pub steps: Vec<Step>,
    pub outputs: Vec<usize>,
    /// Symbolic dims, in order of first appearance.
    pub dims: Vec<String>,
}

/// A value during lowering.
#[derive(Clone, Copy)]
enum Val {
    Step(usize),
    Lit(f64),
    /// The expression had an error (already reported).
    Poison,
}

struct Lowerer {
    builder: ProgramBuilder,
    steps: Vec<Step>,
    ids: Vec<ValueId>,
    env: HashMap<String, Val>,
    errors: Vec<Error>,
}

/// Lowers and checks `func`; returns every error at once.
/// The lowered function, and the errors found (all of them, combined), if any. With
/// errors, the lowered part is what checked: enough to emit the function's items so the
/// rest of the user's crate (and rust-analyzer) still sees them.
pub fn lower(func: &syn::ItemFn, options: &Options) -> (Lowered, Option<Error>) {
    let mut l = Lowerer {
        builder: ProgramBuilder::new(func.sig.ident.to_string()),
        steps: Vec::new(),
        ids: Vec::new(),
        env: HashMap::new(),
        errors: Vec::new(),
    };
    if let Err(e) = l.builder.set_groups(options.groups) {
        l.errors.push(Error::new(Span::call_site(), e.message));
    }
    if !func.sig.generics.params.is_empty() {
        l.error(&func.sig.generics, "coconet programs cannot be generic");
    }
    let mut dims: Vec<String> = Vec::new();
    for arg in &func.sig.inputs {
        l.param(arg, &mut dims);
    }
    let stmts = &func.block.stmts;
    let mut outputs = Vec::new();
    for (i, stmt) in stmts.iter().enumerate() {
        let last = i + 1 == stmts.len();
        if let Some(out) = l.stmt(stmt, last) {
            outputs.extend(out);
        }
    }
    for out in &outputs {
        let r = l.builder.output(l.ids[*out]);
        debug_assert!(r.is_ok());
    }
    if l.errors.is_empty() {
        check_schedules(&l.builder, options, &mut l.errors);
    }
    let mut errors = l.errors.into_iter();
    let error = errors.next().map(|mut first| {
        errors.for_each(|e| first.combine(e));
        first
    });
    let lowered = Lowered {
        steps: l.steps,
        outputs,
        dims,
    };
    (lowered, error)
}

/// Applies every schedule of the attribute to the checked program; a failing step is a
/// compile error at that step.
fn check_schedules(b: &ProgramBuilder, options: &Options, errors: &mut Vec<Error>) {
    for s in &options.schedules {
        let steps: Vec<_> = s.steps.iter().map(|(step, _)| step.clone()).collect();
        let name = s.name.to_string();
        if let Err((i, e)) = coconet_core::Schedule::from_steps(b.program(), &name, &steps) {
            errors.push(Error::new_spanned(
                &s.steps[i].1,
                format!("schedule `{name}`: {e}"),
            ));
        }
    }
}

/// Spelling of every operation, for arity errors and suggestions.
const OPS: &[(&str, &str)] = &[
    ("all_reduce", "(op, x)"),
    ("reduce_scatter", "(op, x) or (op, x, dim)"),
    ("all_gather", "(x)"),
    ("broadcast", "(x, root)"),
    ("reduce", "(op, x, root)"),
    ("scatter", "(x) or (x, dim)"),
    ("send", "(x, Next | Prev)"),
    ("update", "(input, value)"),
    ("matmul", "(a, b)"),
    ("select", "(cond, a, b)"),
    ("cast", "::<dtype>(x)"),
    ("dropout", "(x, p, seed)"),
    ("layer_norm", "(x, gamma, beta, eps)"),
    ("pow", "(a, b)"),
    ("min", "(a, b)"),
    ("max", "(a, b)"),
    ("reduce_sum", "(x)"),
    ("reduce_max", "(x)"),
    ("reduce_min", "(x)"),
    ("norm2", "(x)"),
    ("abs", "(x)"),
    ("sqrt", "(x)"),
    ("rsqrt", "(x)"),
    ("exp", "(x)"),
    ("log", "(x)"),
    ("tanh", "(x)"),
    ("relu", "(x)"),
    ("gelu", "(x)"),
];

/// A parsed call argument.
enum CallArg {
    Val(Val, TokenStream),
    Op(ReduceOp),
    Int(usize, TokenStream),
    Dir(Direction),
}

/// What kind of argument an operation expects at a position.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    V,
    RedOp,
    Int,
    OptInt,
    Dir,
}

fn kinds(name: &str) -> Option<&'static [Kind]> {
    use Kind::*;
    Some(match name {
        "all_reduce" => &[RedOp, V],
        "reduce_scatter" => &[RedOp, V, OptInt],
        "all_gather" => &[V],
        "broadcast" => &[V, Int],
        "reduce" => &[RedOp, V, Int],
        "scatter" => &[V, OptInt],
        "send" => &[V, Dir],
        "update" | "matmul" | "pow" | "min" | "max" => &[V, V],
        "select" | "dropout" => &[V, V, V],
        "layer_norm" => &[V, V, V, V],
        "cast" => &[V],
        n if UnaryOp::from_name(n).is_some() || ReduceKind::from_name(n).is_some() => &[V],
        _ => return None,
    })
}

impl Lowerer {
    fn error(&mut self, tokens: impl quote::ToTokens, msg: impl std::fmt::Display) {
        self.errors.push(Error::new_spanned(tokens, msg));
    }

    fn param(&mut self, arg: &syn::FnArg, dims: &mut Vec<String>) {
        let syn::FnArg::Typed(pt) = arg else {
            self.error(arg, "coconet programs take no `self`");
            return;
        };
        let ident = match &*pt.pat {
            syn::Pat::Ident(p) if p.by_ref.is_none() && p.subpat.is_none() => p.ident.clone(),
            p => {
                self.error(p, "expected a parameter name");
                return;
            }
        };
        let name = ident.to_string();
        if self.env.contains_key(&name) {
            self.error(&ident, format!("parameter `{name}` is declared twice"));
            return;
        }
        let kind = match signature::param_kind(&pt.ty) {
            Ok(k) => k,
            Err(e) => {
                self.errors.push(e);
                self.env.insert(name, Val::Poison);
                return;
            }
        };
        let call = match kind {
            ParamKind::Tensor {
                dtype,
                layout,
                shape,
                group,
            } => {
                for d in &shape.0 {
                    if let Dim::Sym(s) = d
                        && !dims.contains(s)
                    {
                        dims.push(s.clone());
                    }
                }
                Call::TensorInput {
                    name: name.clone(),
                    dtype,
                    layout,
                    shape,
                    group,
                }
            }
            ParamKind::Scalar(dtype) => Call::ScalarInput {
                name: name.clone(),
                dtype,
            },
        };
        if let Some(clash) = dims
            .iter()
            .find(|d| self.env.contains_key(*d) || **d == name)
        {
            self.error(
                &ident,
                format!(
                    "`{clash}` names both a dimension and a parameter; the argument struct needs distinct names"
                ),
            );
        }
        let ty = pt.ty.to_token_stream();
        let v = self.call(call, ty.clone(), &[ty]);
        if let Val::Step(i) = v {
            self.steps[i].var = ident.clone();
            self.steps[i].bind = Some(ident);
        }
        self.env.insert(name, v);
    }

    /// Lowers a statement; returns output steps for a trailing expression.
    fn stmt(&mut self, stmt: &Stmt, last: bool) -> Option<Vec<usize>> {
        match stmt {
            Stmt::Local(local) => {
                let ident = match &local.pat {
                    syn::Pat::Ident(p)
                        if p.by_ref.is_none() && p.subpat.is_none() && p.mutability.is_none() =>
                    {
                        p.ident.clone()
                    }
                    syn::Pat::Type(t) => {
                        self.error(
                            &t.ty,
                            "remove the type annotation: coconet infers dtype, layout and shape",
                        );
                        return None;
                    }
                    p => {
                        self.error(p, "expected `let name = ...` (a plain, immutable name)");
                        return None;
                    }
                };
                let Some(init) = &local.init else {
                    self.error(local, "a coconet `let` needs a value");
                    return None;
                };
                let first_new = self.steps.len();
                let v = self.expr(&init.expr);
                let name = ident.to_string();
                if self.env.contains_key(&name) {
                    self.error(
                        &ident,
                        format!(
                            "`{name}` is already bound; coconet programs bind each name once (use a new name)"
                        ),
                    );
                    return None;
                }
                if let Val::Step(i) = v {
                    if i < first_new {
                        self.error(
                            &init.expr,
                            format!(
                                "`{name}` would only rename an existing value; use that value directly"
                            ),
                        );
                        self.env.insert(name, Val::Poison);
                        return None;
                    }
                    if let Err(e) = self.builder.bind(self.ids[i], &name) {
                        self.error(&ident, e.message);
                    }
                    self.steps[i].var = ident.clone();
                    self.steps[i].bind = Some(ident);
                }
                self.env.insert(name, v);
                None
            }
            Stmt::Expr(e, semi) => {
                let is_update =
                    matches!(e, Expr::Call(c) if path_name(&c.func).as_deref() == Some("update"));
                if semi.is_none() && last {
                    return Some(self.outputs(e));
                }
                self.expr(e);
                if !is_update {
                    self.error(
                        e,
                        "this value is unused: bind it with `let`, or return it as the last expression",
                    );
                }
                None
            }
            other => {
                self.error(
                    other,
                    "only `let` bindings and expressions are allowed in a coconet program",
                );
                None
            }
        }
    }

    /// The steps returned by the trailing expression: a value or a tuple of values.
    fn outputs(&mut self, e: &Expr) -> Vec<usize> {
        if let Expr::Tuple(t) = e {
            return t.elems.iter().flat_map(|el| self.outputs(el)).collect();
        }
        match self.expr(e) {
            Val::Step(i) => vec![i],
            Val::Lit(_) => {
                self.error(e, "a program cannot return a constant");
                vec![]
            }
            Val::Poison => vec![],
        }
    }

    fn expr(&mut self, e: &Expr) -> Val {
        match e {
            Expr::Paren(p) => self.expr(&p.expr),
            Expr::Group(g) => self.expr(&g.expr),
            Expr::Lit(l) => match &l.lit {
                syn::Lit::Float(f) => f.base10_parse::<f64>().map_or_else(
                    |err| {
                        self.errors.push(err);
                        Val::Poison
                    },
                    Val::Lit,
                ),
                syn::Lit::Int(i) => i.base10_parse::<i64>().map_or_else(
                    |err| {
                        self.errors.push(err);
                        Val::Poison
                    },
                    |x| Val::Lit(x as f64),
                ),
                other => {
                    self.error(other, "only numeric literals are allowed");
                    Val::Poison
                }
            },
            Expr::Path(p) => {
                let Some(name) = p.path.get_ident().map(|i| i.to_string()) else {
                    self.error(p, "expected a name bound in this program");
                    return Val::Poison;
                };
                match self.env.get(&name) {
                    Some(v) => *v,
                    None => {
                        let hint = suggest::hint(&name, self.env.keys().map(String::as_str));
                        self.error(
                            p,
                            format!("cannot find `{name}` in this coconet program{hint}"),
                        );
                        Val::Poison
                    }
                }
            }
            Expr::Unary(u) => {
                let syn::UnOp::Neg(_) = u.op else {
                    self.error(u.op, "only unary `-` is part of the coconet language");
                    return Val::Poison;
                };
                match self.expr(&u.expr) {
                    Val::Lit(x) => Val::Lit(-x),
                    Val::Poison => Val::Poison,
                    v @ Val::Step(_) => self.call(
                        Call::Unary(UnaryOp::Neg, arg(v)),
                        e.to_token_stream(),
                        &[u.expr.to_token_stream()],
                    ),
                }
            }
            Expr::Binary(b) => {
                let op = match b.op {
                    syn::BinOp::Add(_) => BinaryOp::Add,
                    syn::BinOp::Sub(_) => BinaryOp::Sub,
                    syn::BinOp::Mul(_) => BinaryOp::Mul,
                    syn::BinOp::Div(_) => BinaryOp::Div,
                    syn::BinOp::Lt(_) => BinaryOp::Lt,
                    syn::BinOp::Le(_) => BinaryOp::Le,
                    syn::BinOp::Gt(_) => BinaryOp::Gt,
                    syn::BinOp::Ge(_) => BinaryOp::Ge,
                    syn::BinOp::Eq(_) => BinaryOp::Eq,
                    syn::BinOp::Ne(_) => BinaryOp::Ne,
                    other => {
                        self.error(other, "this operator is not part of the coconet language");
                        return Val::Poison;
                    }
                };
                let (l, r) = (self.expr(&b.left), self.expr(&b.right));
                self.binary(
                    op,
                    e.to_token_stream(),
                    (l, b.left.to_token_stream()),
                    (r, b.right.to_token_stream()),
                )
            }
            Expr::Call(c) => self.call_expr(c),
            Expr::MethodCall(m) => {
                let receiver = m.receiver.to_token_stream().to_string();
                let rest = if m.args.is_empty() { "" } else { ", .." };
                self.error(
                    &m.method,
                    format!(
                        "method calls are not part of the coconet language; write `{}({receiver}{rest})`",
                        m.method
                    ),
                );
                Val::Poison
            }
            other => {
                self.error(other, "unsupported expression in a coconet program");
                Val::Poison
            }
        }
    }

    fn binary(
        &mut self,
        op: BinaryOp,
        span: TokenStream,
        l: (Val, TokenStream),
        r: (Val, TokenStream),
    ) -> Val {
        match (l.0, r.0) {
            (Val::Poison, _) | (_, Val::Poison) => Val::Poison,
            (Val::Lit(a), Val::Lit(b)) => Val::Lit(op.eval(a, b, false)),
            (a, b) => {
                let (a, b) = (arg(a), arg(b));
                self.call(Call::Binary(op, a, b), span, &[l.1, r.1])
            }
        }
    }

    fn call_expr(&mut self, c: &syn::ExprCall) -> Val {
        let span = c.to_token_stream();
        let Expr::Path(fp) = &*c.func else {
            self.error(&c.func, "expected an operation name");
            return Val::Poison;
        };
        let seg = match fp.path.segments.last() {
            Some(s) if fp.path.segments.len() == 1 => s,
            _ => {
                self.error(&c.func, "expected an operation name");
                return Val::Poison;
            }
        };
        let name = seg.ident.to_string();
        let Some(kinds) = kinds(&name) else {
            let hint = suggest::hint(&name, OPS.iter().map(|o| o.0));
            self.error(&seg.ident, format!("unknown operation `{name}`{hint}"));
            return Val::Poison;
        };
        let usage = OPS.iter().find(|o| o.0 == name).map_or("", |o| o.1);
        let required = kinds.iter().filter(|k| **k != Kind::OptInt).count();
        let n = c.args.len();
        if n < required || n > kinds.len() {
            let count = if required == kinds.len() {
                format!("{required}")
            } else {
                format!("{required} or {}", kinds.len())
            };
            self.errors.push(Error::new(
                c.paren_token.span.join(),
                format!("`{name}` takes {count} argument(s), as in `{name}{usage}`; got {n}"),
            ));
            return Val::Poison;
        }
        // cast::<dtype>(x)
        let cast_to = if name == "cast" {
            match &seg.arguments {
                syn::PathArguments::AngleBracketed(a) if a.args.len() == 1 => match &a.args[0] {
                    syn::GenericArgument::Type(t) => match t_dtype(t) {
                        Some(d) => Some(d),
                        None => {
                            self.error(
                                t,
                                "unknown dtype; expected f16, bf16, f32, f64, i32, i64 or bool",
                            );
                            return Val::Poison;
                        }
                    },
                    other => {
                        self.error(other, "expected a dtype");
                        return Val::Poison;
                    }
                },
                _ => {
                    self.error(&seg.ident, "write the target dtype as `cast::<f32>(x)`");
                    return Val::Poison;
                }
            }
        } else {
            if !seg.arguments.is_none() {
                self.error(&seg.arguments, format!("`{name}` takes no type arguments"));
                return Val::Poison;
            }
            None
        };
        let mut parsed = Vec::new();
        let mut poisoned = false;
        for (a, kind) in c.args.iter().zip(kinds) {
            let p = match kind {
                Kind::V => {
                    let v = self.expr(a);
                    poisoned |= matches!(v, Val::Poison);
                    Some(CallArg::Val(v, a.to_token_stream()))
                }
                Kind::RedOp => self.word(a, "a reduction (Sum, Prod, Max, Min, Avg)", |s| {
                    ReduceOp::from_name(s).map(CallArg::Op)
                }),
                Kind::Dir => self.word(a, "a direction (Next or Prev)", |s| match s {
                    "Next" => Some(CallArg::Dir(Direction::Next)),
                    "Prev" => Some(CallArg::Dir(Direction::Prev)),
                    _ => None,
                }),
                Kind::Int | Kind::OptInt => match a {
                    Expr::Lit(syn::ExprLit {
                        lit: syn::Lit::Int(i),
                        ..
                    }) => match i.base10_parse::<usize>() {
                        Ok(x) => Some(CallArg::Int(x, a.to_token_stream())),
                        Err(e) => {
                            self.errors.push(e);
                            None
                        }
                    },
                    _ => {
                        self.error(a, "expected an integer literal (a dim or a root rank)");
                        None
                    }
                },
            };
            match p {
                Some(p) => parsed.push(p),
                None => poisoned = true,
            }
        }
        if poisoned {
            return Val::Poison;
        }
        self.build_call(&name, cast_to, span, &parsed)
    }

    fn word(
        &mut self,
        e: &Expr,
        what: &str,
        f: impl Fn(&str) -> Option<CallArg>,
    ) -> Option<CallArg> {
        let found = match e {
            Expr::Path(p) => p.path.get_ident().and_then(|i| f(&i.to_string())),
            _ => None,
        };
        if found.is_none() {
            self.error(e, format!("expected {what}"));
        }
        found
    }

    fn build_call(
        &mut self,
        name: &str,
        cast_to: Option<DType>,
        span: TokenStream,
        args: &[CallArg],
    ) -> Val {
        // Spans of the builder's operands: every argument but reduce ops and directions.
        let spans: Vec<TokenStream> = args
            .iter()
            .filter_map(|a| match a {
                CallArg::Val(_, s) | CallArg::Int(_, s) => Some(s.clone()),
                _ => None,
            })
            .collect();
        let vals: Vec<Val> = args
            .iter()
            .filter_map(|a| match a {
                CallArg::Val(v, _) => Some(*v),
                _ => None,
            })
            .collect();
        let op = args.iter().find_map(|a| match a {
            CallArg::Op(o) => Some(*o),
            _ => None,
        });
        let int = args.iter().find_map(|a| match a {
            CallArg::Int(i, _) => Some(*i),
            _ => None,
        });
        let dir = args.iter().find_map(|a| match a {
            CallArg::Dir(d) => Some(*d),
            _ => None,
        });
        let a = |i: usize| arg(vals[i]);
        // Collectives and update targets need a program value, not a literal.
        let needs_tensor = matches!(
            name,
            "all_reduce"
                | "reduce_scatter"
                | "all_gather"
                | "broadcast"
                | "reduce"
                | "scatter"
                | "send"
                | "update"
        );
        let t = match vals.first() {
            Some(Val::Step(k)) => *k,
            _ if needs_tensor => {
                self.errors.push(Error::new_spanned(
                    &spans[0],
                    format!("`{name}` needs a tensor here, not a constant"),
                ));
                return Val::Poison;
            }
            _ => 0,
        };
        let call = match name {
            "all_reduce" => Call::AllReduce(op.expect("kinds"), t),
            "reduce_scatter" => Call::ReduceScatter(op.expect("kinds"), t, int.unwrap_or(0)),
            "all_gather" => Call::AllGather(t),
            "broadcast" => Call::Broadcast(t, int.expect("kinds")),
            "reduce" => Call::Reduce(op.expect("kinds"), t, int.expect("kinds")),
            "scatter" => Call::Scatter(t, int.unwrap_or(0)),
            "send" => Call::Send(t, dir.expect("kinds")),
            "update" => Call::Update(t, a(1)),
            "matmul" => Call::MatMul(a(0), a(1)),
            "pow" => Call::Binary(BinaryOp::Pow, a(0), a(1)),
            "min" => Call::Binary(BinaryOp::Min, a(0), a(1)),
            "max" => Call::Binary(BinaryOp::Max, a(0), a(1)),
            "select" => Call::Select(a(0), a(1), a(2)),
            "dropout" => Call::Dropout(a(0), a(1), a(2)),
            "layer_norm" => Call::LayerNorm(a(0), a(1), a(2), a(3)),
            "cast" => Call::Cast(cast_to.expect("parsed"), a(0)),
            n => {
                if let Some(k) = ReduceKind::from_name(n) {
                    Call::ReduceAll(k, a(0))
                } else {
                    let u = UnaryOp::from_name(n).expect("kinds");
                    if let Val::Lit(x) = vals[0] {
                        return Val::Lit(u.eval(x));
                    }
                    Call::Unary(u, a(0))
                }
            }
        };
        // Binary ops of two literals fold (pow/min/max of constants).
        if let Call::Binary(op, Arg::Lit(x), Arg::Lit(y)) = call {
            return Val::Lit(op.eval(x, y, false));
        }
        self.call(call, span, &spans)
    }

    /// Runs the call through the checker and records it.
    fn call(&mut self, call: Call, span: TokenStream, operand_spans: &[TokenStream]) -> Val {
        match apply(&call, &mut self.builder, &self.ids) {
            Ok(id) => {
                let ty = self.builder.ty(id);
                let doc = format!("{ty}");
                let dtype = ty.dtype;
                let i = self.steps.len();
                self.steps.push(Step {
                    var: format_ident!("__t{}", i),
                    call,
                    bind: None,
                    dtype,
                    doc,
                });
                self.ids.push(id);
                Val::Step(i)
            }
            Err(e) => {
                let at = e
                    .blame
                    .operand()
                    .and_then(|i| operand_spans.get(i))
                    .unwrap_or(&span);
                self.errors.push(Error::new_spanned(at, e.message));
                Val::Poison
            }
        }
    }
}

fn t_dtype(t: &syn::Type) -> Option<DType> {
    match crate::signature::ungrouped(t) {
        syn::Type::Path(p) => p
            .path
            .get_ident()
            .and_then(|i| DType::from_name(&i.to_string())),
        _ => None,
    }
}

fn path_name(e: &Expr) -> Option<String> {
    match e {
        Expr::Path(p) => p.path.get_ident().map(|i| i.to_string()),
        _ => None,
    }
}

fn arg(v: Val) -> Arg {
    match v {
        Val::Step(i) => Arg::Step(i),
        Val::Lit(x) => Arg::Lit(x),
        Val::Poison => unreachable!("poisoned values are filtered before building calls"),
    }
}

/// Performs `call` on the builder (compile-time check); `ids` maps steps to values.
pub fn apply(call: &Call, b: &mut ProgramBuilder, ids: &[ValueId]) -> Result<ValueId, CheckError> {
    let o = |a: &Arg| match *a {
        Arg::Step(i) => Operand::Value(ids[i]),
        Arg::Lit(x) => Operand::Lit(x),
    };
    match call {
        Call::TensorInput {
            name,
            dtype,
            layout,
            shape,
            group,
        } => b.tensor_input(name, *dtype, *layout, shape.clone(), *group),
        Call::ScalarInput { name, dtype } => b.scalar_input(name, *dtype),
        Call::Unary(op, x) => b.unary(*op, o(x)),
        Call::Binary(op, x, y) => b.binary(*op, o(x), o(y)),
        Call::Select(c, x, y) => b.select(o(c), o(x), o(y)),
        Call::Cast(d, x) => b.cast(*d, o(x)),
        Call::Dropout(x, p, s) => b.dropout(o(x), o(p), o(s)),
        Call::MatMul(x, y) => b.matmul(o(x), o(y)),
        Call::ReduceAll(k, x) => b.reduce_all(*k, o(x)),
        Call::LayerNorm(x, g, be, e) => b.layer_norm(o(x), o(g), o(be), o(e)),
        Call::AllReduce(op, x) => b.all_reduce(*op, ids[*x]),
        Call::ReduceScatter(op, x, d) => b.reduce_scatter(*op, ids[*x], *d),
        Call::AllGather(x) => b.all_gather(ids[*x]),
        Call::Broadcast(x, r) => b.broadcast(ids[*x], *r),
        Call::Reduce(op, x, r) => b.reduce(*op, ids[*x], *r),
        Call::Scatter(x, d) => b.scatter(ids[*x], *d),
        Call::Send(x, d) => b.send(ids[*x], *d),
        Call::Update(t, v) => b.update(ids[*t], o(v)),
    }
}
