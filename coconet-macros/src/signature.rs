//! Parsing the attribute options and the function signature: every parameter is either a
//! tensor `Tensor<dtype, layout, shape[, Group<g>]>` or a scalar (`f32`, `i32`, ...).
//!
//! Shapes are written as a slice `[N]` (one dim), a tuple `(B, S, H)`, or `()` (rank 0);
//! a constant dim is `Const<1024>`. Layouts are `Replicated`, `Local` or `Sliced<d>`.

use coconet_core::{DType, Dim, Layout, Shape};
use syn::spanned::Spanned;
use syn::{Error, GenericArgument, PathArguments, Type};

/// Options from `#[coconet(...)]`.
pub struct Options {
    /// Number of process groups (`groups = G`).
    pub groups: usize,
    /// Schedules named in `schedule(name = ..., ...)`.
    pub schedules: Vec<crate::schedule::NamedSchedule>,
    /// The path the generated code names the `coconet` crate by (`crate = path`;
    /// `::coconet` unless given): it uses `path::core` and nothing else.
    pub krate: syn::Path,
}

const OPTIONS: &str = "expected `groups = G` or `schedule(name = [steps], ...)`";

/// Parses `groups = G`, `schedule(name = steps, ...)` and `crate = path`.
pub fn parse_options(attr: proc_macro2::TokenStream) -> syn::Result<Options> {
    let mut options = Options {
        groups: 1,
        schedules: Vec::new(),
        krate: syn::parse_quote!(::coconet),
    };
    let parser = syn::punctuated::Punctuated::<syn::Meta, syn::Token![,]>::parse_terminated;
    for meta in syn::parse::Parser::parse2(parser, attr)? {
        match meta {
            syn::Meta::NameValue(m) if m.path.is_ident("groups") => {
                options.groups = match &m.value {
                    syn::Expr::Lit(syn::ExprLit {
                        lit: syn::Lit::Int(i),
                        ..
                    }) => i.base10_parse()?,
                    v => return Err(Error::new_spanned(v, "`groups` must be an integer literal")),
                };
                if options.groups == 0 {
                    return Err(Error::new_spanned(&m.value, "`groups` must be at least 1"));
                }
            }
            syn::Meta::NameValue(m) if m.path.is_ident("crate") => {
                options.krate = crate_path(&m.value)?;
            }
            syn::Meta::List(l) if l.path.is_ident("schedule") => {
                let inner =
                    syn::punctuated::Punctuated::<syn::MetaNameValue, syn::Token![,]>::parse_terminated;
                for nv in l.parse_args_with(inner)? {
                    options.schedules.push(crate::schedule::parse(&nv)?);
                }
            }
            other => {
                let path = other.path().clone();
                return Err(Error::new_spanned(
                    path,
                    format!("unknown coconet option; {OPTIONS}"),
                ));
            }
        }
    }
    Ok(options)
}

/// The value of `crate = path`: a plain path (`my_crate::coconet`, `crate`, `::coconet`),
/// without generic arguments or quotes.
fn crate_path(value: &syn::Expr) -> syn::Result<syn::Path> {
    const EXPECTED: &str = "`crate` must be the path of the `coconet` crate or a re-export of it, e.g. `crate = my_crate::coconet`";
    match value {
        syn::Expr::Path(p)
            if p.qself.is_none()
                && p.attrs.is_empty()
                && p.path.segments.iter().all(|s| s.arguments.is_none()) =>
        {
            Ok(p.path.clone())
        }
        syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Str(s),
            ..
        }) => Err(Error::new_spanned(
            value,
            format!(
                "{EXPECTED}; write the path without quotes: `crate = {}`",
                s.value()
            ),
        )),
        v => Err(Error::new_spanned(v, EXPECTED)),
    }
}

/// A parameter's declared kind.
pub enum ParamKind {
    /// A tensor input.
    Tensor {
        /// Element type.
        dtype: DType,
        /// Layout.
        layout: Layout,
        /// Logical shape.
        shape: Shape,
        /// Process group.
        group: usize,
    },
    /// A scalar input.
    Scalar(DType),
}

const DTYPES: &str = "f16, bf16, f32, f64, i32, i64 or bool";

/// `ty` without the invisible group rustc puts around a `$t:ty` substituted by a
/// `macro_rules!` macro (and without parentheses).
pub(crate) fn ungrouped(ty: &Type) -> &Type {
    match ty {
        Type::Group(g) => ungrouped(&g.elem),
        Type::Paren(p) => ungrouped(&p.elem),
        t => t,
    }
}

fn ident_of(ty: &Type) -> Option<&syn::Ident> {
    match ungrouped(ty) {
        Type::Path(p) if p.qself.is_none() && p.path.segments.len() == 1 => {
            let seg = &p.path.segments[0];
            matches!(seg.arguments, PathArguments::None).then_some(&seg.ident)
        }
        _ => None,
    }
}

fn dtype(ty: &Type) -> syn::Result<DType> {
    ident_of(ty)
        .and_then(|i| DType::from_name(&i.to_string()))
        .ok_or_else(|| Error::new_spanned(ty, format!("unknown dtype; expected {DTYPES}")))
}

/// Last path segment named `name` with angle-bracketed args, e.g. `Sliced<0>`.
fn generic<'a>(ty: &'a Type, name: &str) -> Option<Vec<&'a GenericArgument>> {
    let Type::Path(p) = ungrouped(ty) else {
        return None;
    };
    let seg = p.path.segments.last()?;
    if seg.ident != name {
        return None;
    }
    match &seg.arguments {
        PathArguments::AngleBracketed(a) => Some(a.args.iter().collect()),
        _ => None,
    }
}

fn int_arg(arg: &GenericArgument) -> syn::Result<usize> {
    match arg {
        GenericArgument::Const(syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Int(i),
            ..
        })) => i.base10_parse(),
        a => Err(Error::new_spanned(a, "expected an integer literal")),
    }
}

fn one_int(ty: &Type, name: &str) -> Option<syn::Result<usize>> {
    let args = generic(ty, name)?;
    Some(match args.as_slice() {
        [a] => int_arg(a),
        _ => Err(Error::new_spanned(ty, format!("expected `{name}<n>`"))),
    })
}

fn layout(arg: &GenericArgument) -> syn::Result<Layout> {
    let err = || {
        Error::new_spanned(
            arg,
            "unknown layout; expected `Replicated`, `Local` or `Sliced<dim>`",
        )
    };
    let GenericArgument::Type(ty) = arg else {
        return Err(err());
    };
    if let Some(d) = one_int(ty, "Sliced") {
        return Ok(Layout::Sliced(d?));
    }
    match ident_of(ty).map(|i| i.to_string()).as_deref() {
        Some("Replicated") => Ok(Layout::Replicated),
        Some("Local") => Ok(Layout::Local),
        _ => Err(err()),
    }
}

fn dim(ty: &Type) -> syn::Result<Dim> {
    if let Some(c) = one_int(ty, "Const") {
        return Ok(Dim::Const(c?));
    }
    match ident_of(ty) {
        Some(i) => Ok(Dim::Sym(i.to_string())),
        None => Err(Error::new_spanned(
            ty,
            "expected a dimension: a name such as `N`, or `Const<size>`",
        )),
    }
}

fn shape(arg: &GenericArgument) -> syn::Result<Shape> {
    let err = || {
        Error::new_spanned(
            arg,
            "expected a shape: `[N]`, a tuple `(B, S, H)`, or `()` for rank 0",
        )
    };
    let GenericArgument::Type(ty) = arg else {
        return Err(err());
    };
    let mut ty: &Type = ty;
    // A `$s:ty` from a `macro_rules!` macro arrives in an invisible group; parentheses
    // are a 1-dim shape here, so only the group is looked through.
    while let Type::Group(g) = ty {
        ty = &g.elem;
    }
    match ty {
        Type::Slice(s) => Ok(Shape::new(vec![dim(&s.elem)?])),
        Type::Tuple(t) => Ok(Shape::new(
            t.elems.iter().map(dim).collect::<syn::Result<_>>()?,
        )),
        Type::Paren(p) => Ok(Shape::new(vec![dim(&p.elem)?])),
        _ => Err(err()),
    }
}

/// Parses one parameter type.
pub fn param_kind(ty: &Type) -> syn::Result<ParamKind> {
    if let Some(args) = generic(ty, "Tensor") {
        if !(3..=4).contains(&args.len()) {
            return Err(Error::new_spanned(
                ty,
                "expected `Tensor<dtype, layout, shape>` or `Tensor<dtype, layout, shape, Group<g>>`",
            ));
        }
        let GenericArgument::Type(dt) = args[0] else {
            return Err(Error::new_spanned(
                args[0],
                format!("expected a dtype: {DTYPES}"),
            ));
        };
        let group = match args.get(3) {
            None => 0,
            Some(GenericArgument::Type(g)) if generic(g, "Group").is_some() => {
                one_int(g, "Group").expect("checked")?
            }
            Some(a) => return Err(Error::new_spanned(a, "expected `Group<g>`")),
        };
        return Ok(ParamKind::Tensor {
            dtype: dtype(dt)?,
            layout: layout(args[1])?,
            shape: shape(args[2])?,
            group,
        });
    }
    match ident_of(ty).and_then(|i| DType::from_name(&i.to_string())) {
        Some(d) => Ok(ParamKind::Scalar(d)),
        None => Err(Error::new(
            ty.span(),
            format!("expected `Tensor<dtype, layout, shape>` or a scalar type ({DTYPES})"),
        )),
    }
}
