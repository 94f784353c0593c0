//! `#[coconet(schedule(name = [steps...]))]`: schedules named in the attribute, parsed
//! into `coconet_core::schedule::Step`s that the macro applies at compile time and the
//! generated `Program::name()` method replays.

use coconet_core::schedule::Step;
use proc_macro2::{Ident, TokenStream};
use quote::{ToTokens, quote};
use syn::{Error, Expr};

/// A schedule from the attribute: its name and steps (with their tokens, for errors).
pub struct NamedSchedule {
    pub name: Ident,
    pub steps: Vec<(Step, TokenStream)>,
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
        .map(|c| Ok((step(c)?, c.to_token_stream())))
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

const STEPS: &str = "split(ar[, dim]), split_reduce_broadcast(ar, root), reorder([comps], ag), \
                     reorder(ag), as_slice([tensors]), fuse([stages]), fuse_all_reduce(rs), \
                     overlap(producer, consumer), eliminate_dead_code(), sharded_update(ar, [state])";

fn step(e: &Expr) -> syn::Result<Step> {
    let Expr::Call(c) = e else {
        return Err(Error::new_spanned(e, format!("expected a step: {STEPS}")));
    };
    let op = match &*c.func {
        Expr::Path(p) => p.path.get_ident().map(|i| i.to_string()),
        _ => None,
    }
    .ok_or_else(|| Error::new_spanned(&c.func, format!("expected a step: {STEPS}")))?;
    let a: Vec<&Expr> = c.args.iter().collect();
    let arity = || {
        Error::new(
            c.paren_token.span.join(),
            format!("wrong arguments for `{op}`; the steps are {STEPS}"),
        )
    };
    Ok(match (op.as_str(), a.as_slice()) {
        ("split", [x]) => Step::Split(name(x)?, 0),
        ("split", [x, d]) => Step::Split(name(x)?, int(d)?),
        ("split_reduce_broadcast", [x, r]) => Step::SplitReduceBroadcast(name(x)?, int(r)?),
        ("reorder", [comps, ag]) => Step::Reorder(names(comps)?, name(ag)?),
        ("reorder", [ag]) => Step::ReorderAll(name(ag)?),
        ("as_slice", [ts]) => Step::AsSlice(names(ts)?),
        ("fuse", [ss]) => Step::Fuse(names(ss)?),
        ("fuse_all_reduce", [rs]) => Step::FuseAllReduce(name(rs)?),
        ("overlap", [p, q]) => Step::Overlap(name(p)?, name(q)?),
        ("eliminate_dead_code", []) => Step::EliminateDeadCode,
        ("sharded_update", [ar, st]) => Step::ShardedUpdate(name(ar)?, names(st)?),
        (
            "split"
            | "split_reduce_broadcast"
            | "reorder"
            | "as_slice"
            | "fuse"
            | "fuse_all_reduce"
            | "overlap"
            | "eliminate_dead_code"
            | "sharded_update",
            _,
        ) => return Err(arity()),
        _ => {
            return Err(Error::new_spanned(
                &c.func,
                format!("unknown schedule step `{op}`; the steps are {STEPS}"),
            ));
        }
    })
}

/// Tokens that construct `step` at run time.
pub fn step_tokens(step: &Step) -> TokenStream {
    let s = |x: &String| quote!(::std::string::String::from(#x));
    let v = |xs: &Vec<String>| {
        let xs = xs.iter().map(s);
        quote!(::std::vec![#(#xs),*])
    };
    let p = quote!(__cc::schedule::Step);
    match step {
        Step::Split(a, d) => {
            let a = s(a);
            quote!(#p::Split(#a, #d))
        }
        Step::SplitReduceBroadcast(a, r) => {
            let a = s(a);
            quote!(#p::SplitReduceBroadcast(#a, #r))
        }
        Step::Reorder(c, a) => {
            let (c, a) = (v(c), s(a));
            quote!(#p::Reorder(#c, #a))
        }
        Step::ReorderAll(a) => {
            let a = s(a);
            quote!(#p::ReorderAll(#a))
        }
        Step::AsSlice(t) => {
            let t = v(t);
            quote!(#p::AsSlice(#t))
        }
        Step::Fuse(t) => {
            let t = v(t);
            quote!(#p::Fuse(#t))
        }
        Step::FuseAllReduce(a) => {
            let a = s(a);
            quote!(#p::FuseAllReduce(#a))
        }
        Step::Overlap(a, b) => {
            let (a, b) = (s(a), s(b));
            quote!(#p::Overlap(#a, #b))
        }
        Step::EliminateDeadCode => quote!(#p::EliminateDeadCode),
        Step::ShardedUpdate(a, st) => {
            let (a, st) = (s(a), v(st));
            quote!(#p::ShardedUpdate(#a, #st))
        }
    }
}
