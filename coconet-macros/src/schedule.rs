//! `#[coconet(schedule(name = [steps...]))]`: schedules named in the attribute, parsed
//! with the spellings coconet-core declares into `coconet_core::schedule::Step`s, which
//! the macro applies at compile time and the generated `Program::name()` method replays
//! as written.

use coconet_core::schedule::{Step, StepArg, StepParam};
use proc_macro2::{Ident, TokenStream};
use quote::{ToTokens, quote};
use syn::{Error, Expr};

/// A schedule from the attribute: its name and steps.
pub struct NamedSchedule {
    pub name: Ident,
    pub steps: Vec<WrittenStep>,
}

/// One step as the attribute writes it.
pub struct WrittenStep {
    /// The step's name (`split`).
    pub name: String,
    /// Its arguments.
    pub args: Vec<StepArg>,
    /// The step they make.
    pub step: Step,
    /// Its tokens, for errors and docs.
    pub tokens: TokenStream,
}

/// Parses `name = sharded_update(ar, [state])` or `name = [step, step, ...]`.
pub fn parse(nv: &syn::MetaNameValue) -> syn::Result<NamedSchedule> {
    let name = nv
        .path
        .get_ident()
        .cloned()
        .ok_or_else(|| Error::new_spanned(&nv.path, "a schedule name must be an identifier"))?;
    let calls: Vec<&Expr> = match &nv.value {
        Expr::Array(a) => a.elems.iter().collect(),
        e @ Expr::Call(_) => vec![e],
        e => {
            return Err(Error::new_spanned(
                e,
                "expected a list of steps `[split(g1), ...]` or a recipe `sharded_update(g1, [m, v])`",
            ));
        }
    };
    let steps = calls
        .into_iter()
        .map(|c| {
            let (name, args, step) = step(c)?;
            Ok(WrittenStep {
                name,
                args,
                step,
                tokens: c.to_token_stream(),
            })
        })
        .collect::<syn::Result<_>>()?;
    Ok(NamedSchedule { name, steps })
}

fn name(e: &Expr) -> syn::Result<String> {
    match e {
        Expr::Path(p) => p
            .path
            .get_ident()
            .map(|i| i.to_string())
            .ok_or_else(|| Error::new_spanned(e, "expected the name of a value")),
        _ => Err(Error::new_spanned(e, "expected the name of a value")),
    }
}

fn names(e: &Expr) -> syn::Result<Vec<String>> {
    match e {
        Expr::Array(a) => a.elems.iter().map(name).collect(),
        _ => Err(Error::new_spanned(e, "expected a list of names `[a, b]`")),
    }
}

fn int(e: &Expr) -> syn::Result<usize> {
    match e {
        Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Int(i),
            ..
        }) => i.base10_parse(),
        _ => Err(Error::new_spanned(e, "expected an integer literal")),
    }
}

/// Parses one step with the spellings coconet-core declares: the written form, for the
/// generated code to replay, and the step it makes.
fn step(e: &Expr) -> syn::Result<(String, Vec<StepArg>, Step)> {
    let expected = || format!("expected a step: {}", Step::usage());
    let Expr::Call(c) = e else {
        return Err(Error::new_spanned(e, expected()));
    };
    let op = match &*c.func {
        Expr::Path(p) => p.path.get_ident().map(|i| i.to_string()),
        _ => None,
    }
    .ok_or_else(|| Error::new_spanned(&c.func, expected()))?;
    let a: Vec<&Expr> = c.args.iter().collect();
    let mut named = Step::spellings().iter().filter(|s| s.name == op).peekable();
    if named.peek().is_none() {
        return Err(Error::new_spanned(
            &c.func,
            format!(
                "unknown schedule step `{op}`; the steps are {}",
                Step::usage()
            ),
        ));
    }
    let spelling = named.find(|s| s.accepts(a.len())).ok_or_else(|| {
        Error::new(
            c.paren_token.span.join(),
            format!(
                "wrong arguments for `{op}`; the steps are {}",
                Step::usage()
            ),
        )
    })?;
    let args = spelling
        .params
        .iter()
        .zip(a)
        .map(|(param, e)| match param {
            StepParam::Name => name(e).map(StepArg::Name),
            StepParam::Names => names(e).map(StepArg::Names),
            StepParam::Int | StepParam::OptInt => int(e).map(StepArg::Int),
        })
        .collect::<syn::Result<Vec<_>>>()?;
    let step = Step::written(&op, &args).map_err(|e| Error::new_spanned(c, e))?;
    Ok((op, args, step))
}

/// Tokens that write `step` for [`coconet_core::Schedule::from_written`]:
/// `("split", vec!["g1".into(), 0usize.into()])`.
pub fn written_tokens(step: &WrittenStep) -> TokenStream {
    let name = &step.name;
    let args = step.args.iter().map(|a| match a {
        StepArg::Name(n) => quote!(#n.into()),
        StepArg::Names(ns) => quote!(::std::vec![#(#ns),*].into()),
        StepArg::Int(x) => quote!(#x.into()),
    });
    quote!((#name, ::std::vec![#(#args),*]))
}
