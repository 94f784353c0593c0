//! Lowering the function body to builder calls, running each through the checker as it
//! goes. Every error is collected with the span of the offending tokens; a failed
//! expression yields a poisoned value so later uses do not pile up follow-on errors.

use crate::signature::{self, Options, ParamKind};
use crate::suggest;
use coconet_core::builtin::{Arg as BuiltinArg, Builtin, Param};
use coconet_core::{
    BinaryOp, CheckError, DType, Dim, Direction, Layout, Operand, ProgramBuilder, ReduceOp, Shape,
    UnaryOp, ValueId,
};
use proc_macro2::{Ident, Span, TokenStream};
use quote::ToTokens;
use quote::format_ident;
use std::collections::HashMap;
use syn::{Error, Expr, Stmt};

/// A value a builtin call refers to: an earlier step or a literal.
#[derive(Clone, Copy)]
pub enum Ref {
    /// The value of step `i`.
    Step(usize),
    /// A constant.
    Lit(f64),
}

/// What a step does: declare an input, or call a builtin of coconet-core's table (the
/// operations are declared there, not here).
pub enum Make {
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
    Builtin(&'static Builtin, Vec<BuiltinArg<Ref>>),
}

/// A lowered step: the local variable the generated code binds, and its call.
pub struct Step {
    pub var: Ident,
    pub make: Make,
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
        let steps: Vec<_> = s.steps.iter().map(|w| w.step.clone()).collect();
        let name = s.name.to_string();
        if let Err((i, e)) = coconet_core::Schedule::from_steps(b.program(), &name, &steps) {
            errors.push(Error::new_spanned(
                &s.steps[i].tokens,
                format!("schedule `{name}`: {e}"),
            ));
        }
    }
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
                Make::TensorInput {
                    name: name.clone(),
                    dtype,
                    layout,
                    shape,
                    group,
                }
            }
            ParamKind::Scalar(dtype) => Make::ScalarInput {
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
                        Make::Builtin(
                            Builtin::of_unary(UnaryOp::Neg),
                            vec![BuiltinArg::Value(arg(v))],
                        ),
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
                let args = vec![BuiltinArg::Value(arg(a)), BuiltinArg::Value(arg(b))];
                self.call(
                    Make::Builtin(Builtin::of_binary(op), args),
                    span,
                    &[l.1, r.1],
                )
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
        let Some(builtin) = Builtin::callable(&name) else {
            let hint = suggest::hint(&name, Builtin::callable_names());
            self.error(&seg.ident, format!("unknown operation `{name}`{hint}"));
            return Val::Poison;
        };
        if let Some(message) = builtin.arity_error(c.args.len()) {
            self.errors
                .push(Error::new(c.paren_token.span.join(), message));
            return Val::Poison;
        }
        let Some(type_arg) = self.type_arg(builtin, seg) else {
            return Val::Poison;
        };
        let mut args = Vec::new();
        let mut spans = Vec::new();
        let mut poisoned = false;
        let mut written = c.args.iter();
        for &param in builtin.params {
            let a = match param {
                Param::DType => type_arg.map(BuiltinArg::DType),
                _ => match written.next() {
                    Some(e) => {
                        if param.is_operand() {
                            spans.push(e.to_token_stream());
                        }
                        self.arg(param, e)
                    }
                    None => continue,
                },
            };
            match a {
                Some(BuiltinArg::Value(Val::Poison)) | None => poisoned = true,
                Some(a) => args.push(a),
            }
        }
        if poisoned {
            return Val::Poison;
        }
        let literals: Option<Vec<f64>> = args
            .iter()
            .map(|a| match a {
                BuiltinArg::Value(Val::Lit(x)) => Some(*x),
                _ => None,
            })
            .collect();
        if let Some(x) = literals.and_then(|l| builtin.fold(&l)) {
            return Val::Lit(x);
        }
        let args = args.into_iter().map(|a| a.map(arg)).collect();
        self.call(Make::Builtin(builtin, args), span, &spans)
    }

    /// The dtype written as a turbofish, for a builtin that takes one (`cast::<f32>(x)`);
    /// `None` after an error, `Some(None)` for a builtin that takes none.
    fn type_arg(&mut self, builtin: &Builtin, seg: &syn::PathSegment) -> Option<Option<DType>> {
        let name = builtin.name;
        if !builtin.params.contains(&Param::DType) {
            if !seg.arguments.is_none() {
                self.error(&seg.arguments, format!("`{name}` takes no type arguments"));
                return None;
            }
            return Some(None);
        }
        match &seg.arguments {
            syn::PathArguments::AngleBracketed(a) if a.args.len() == 1 => match &a.args[0] {
                syn::GenericArgument::Type(t) => match t_dtype(t) {
                    Some(d) => Some(Some(d)),
                    None => {
                        self.error(
                            t,
                            "unknown dtype; expected f16, bf16, f32, f64, i32, i64 or bool",
                        );
                        None
                    }
                },
                other => {
                    self.error(other, "expected a dtype");
                    None
                }
            },
            _ => {
                self.error(
                    &seg.ident,
                    format!("write the target dtype as `{name}::<f32>(x)`"),
                );
                None
            }
        }
    }

    /// One argument written between the parentheses, as the table says it is written;
    /// `None` after an error.
    fn arg(&mut self, param: Param, e: &Expr) -> Option<BuiltinArg<Val>> {
        match param {
            Param::Value | Param::Tensor => Some(BuiltinArg::Value(self.expr(e))),
            Param::Reduce => self.word(e, "a reduction (Sum, Prod, Max, Min, Avg)", |s| {
                ReduceOp::from_name(s).map(BuiltinArg::Reduce)
            }),
            Param::Direction => self.word(e, "a direction (Next or Prev)", |s| {
                Direction::from_name(s).map(BuiltinArg::Direction)
            }),
            Param::Int | Param::OptInt => match e {
                Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Int(i),
                    ..
                }) => match i.base10_parse::<usize>() {
                    Ok(x) => Some(BuiltinArg::Int(x)),
                    Err(err) => {
                        self.errors.push(err);
                        None
                    }
                },
                _ => {
                    self.error(e, "expected an integer literal (a dim or a root rank)");
                    None
                }
            },
            Param::DType => None,
        }
    }

    fn word(
        &mut self,
        e: &Expr,
        what: &str,
        f: impl Fn(&str) -> Option<BuiltinArg<Val>>,
    ) -> Option<BuiltinArg<Val>> {
        let found = match e {
            Expr::Path(p) => p.path.get_ident().and_then(|i| f(&i.to_string())),
            _ => None,
        };
        if found.is_none() {
            self.error(e, format!("expected {what}"));
        }
        found
    }

    /// Runs the call through the checker and records it.
    fn call(&mut self, make: Make, span: TokenStream, operand_spans: &[TokenStream]) -> Val {
        match apply(&make, &mut self.builder, &self.ids) {
            Ok(id) => {
                let ty = self.builder.ty(id);
                let doc = format!("{ty}");
                let dtype = ty.dtype;
                let i = self.steps.len();
                self.steps.push(Step {
                    var: format_ident!("__t{}", i),
                    make,
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

fn arg(v: Val) -> Ref {
    match v {
        Val::Step(i) => Ref::Step(i),
        Val::Lit(x) => Ref::Lit(x),
        Val::Poison => unreachable!("poisoned values are filtered before building calls"),
    }
}

/// Performs `make` on the builder (compile-time check); `ids` maps steps to values.
pub fn apply(make: &Make, b: &mut ProgramBuilder, ids: &[ValueId]) -> Result<ValueId, CheckError> {
    match make {
        Make::TensorInput {
            name,
            dtype,
            layout,
            shape,
            group,
        } => b.tensor_input(name, *dtype, *layout, shape.clone(), *group),
        Make::ScalarInput { name, dtype } => b.scalar_input(name, *dtype),
        Make::Builtin(builtin, args) => {
            let args: Vec<BuiltinArg> = args
                .iter()
                .map(|a| {
                    a.map(|r| match r {
                        Ref::Step(i) => Operand::Value(ids[i]),
                        Ref::Lit(x) => Operand::Lit(x),
                    })
                })
                .collect();
            builtin.build(b, &args)
        }
    }
}
