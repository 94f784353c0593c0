//! Code generation: a function that builds the checked program at run time, and a module
//! with its typed handles (`Program`) and typed run-time arguments (`Args`).

use crate::lower::{Lowered, Make, Ref, Step};
use crate::signature::Options;
use coconet_core::builtin::Arg as BuiltinArg;
use coconet_core::{DType, Dim, Layout, Shape};
use proc_macro2::{Ident, Span, TokenStream};
use quote::{format_ident, quote};

fn dtype(d: DType) -> TokenStream {
    let v = format_ident!(
        "{}",
        match d {
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::F32 => "F32",
            DType::F64 => "F64",
            DType::I32 => "I32",
            DType::I64 => "I64",
            DType::Bool => "Bool",
        }
    );
    quote!(__cc::DType::#v)
}

/// The Rust element type of a dtype.
fn element(d: DType) -> TokenStream {
    match d {
        DType::F16 => quote!(__cc::half::f16),
        DType::BF16 => quote!(__cc::half::bf16),
        DType::F32 => quote!(f32),
        DType::F64 => quote!(f64),
        DType::I32 => quote!(i32),
        DType::I64 => quote!(i64),
        DType::Bool => quote!(bool),
    }
}

fn layout(l: Layout) -> TokenStream {
    match l {
        Layout::Replicated => quote!(__cc::Layout::Replicated),
        Layout::Local => quote!(__cc::Layout::Local),
        Layout::Sliced(d) => quote!(__cc::Layout::Sliced(#d)),
    }
}

fn shape(s: &Shape) -> TokenStream {
    let dims = s.0.iter().map(|d| match d {
        Dim::Sym(n) => quote!(__cc::Dim::sym(#n)),
        Dim::Const(c) => quote!(__cc::Dim::Const(#c)),
    });
    quote!(__cc::Shape::new(::std::vec![#(#dims),*]))
}

fn variant(name: &str) -> Ident {
    Ident::new(name, Span::call_site())
}

fn float(x: f64) -> TokenStream {
    if x.is_nan() {
        quote!(f64::NAN)
    } else if x.is_infinite() {
        if x > 0.0 {
            quote!(f64::INFINITY)
        } else {
            quote!(f64::NEG_INFINITY)
        }
    } else {
        let l = proc_macro2::Literal::f64_suffixed(x);
        quote!(#l)
    }
}

/// Tokens that build one argument of a builtin call at run time (an
/// `Into<coconet_core::builtin::Arg>`).
fn builtin_arg(a: &BuiltinArg<Ref>, steps: &[Step]) -> TokenStream {
    match *a {
        BuiltinArg::Value(Ref::Step(i)) => {
            let var = &steps[i].var;
            quote!(#var)
        }
        BuiltinArg::Value(Ref::Lit(x)) => {
            let f = float(x);
            quote!(__cc::Operand::Lit(#f))
        }
        BuiltinArg::Reduce(o) => {
            let v = variant(o.name());
            quote!(__cc::ReduceOp::#v)
        }
        BuiltinArg::Int(i) => quote!(#i),
        BuiltinArg::Direction(d) => {
            let v = variant(d.name());
            quote!(__cc::Direction::#v)
        }
        BuiltinArg::DType(d) => dtype(d),
    }
}

fn call(m: &Make, steps: &[Step]) -> TokenStream {
    match m {
        Make::TensorInput {
            name,
            dtype: d,
            layout: l,
            shape: s,
            group,
        } => {
            let (d, l, s) = (dtype(*d), layout(*l), shape(s));
            quote!(__b.tensor_input(#name, #d, #l, #s, #group))
        }
        Make::ScalarInput { name, dtype: d } => {
            let d = dtype(*d);
            quote!(__b.scalar_input(#name, #d))
        }
        Make::Builtin(builtin, args) => {
            let name = builtin.name;
            let args = args.iter().map(|a| builtin_arg(a, steps));
            quote!(__b.builtin(#name, &[#(#args.into()),*]))
        }
    }
}

/// `krate` (written for the item's place) as seen from the module emitted beside the
/// item: `self::p` is `super::p` there and `super::p` is `super::super::p`; a path from
/// the crate root (`crate::`, `::`, `$crate::`) or from an extern crate's name is the same.
fn in_child_module(krate: &syn::Path) -> syn::Path {
    let mut path = krate.clone();
    let Some(first) = path
        .segments
        .first_mut()
        .filter(|_| path.leading_colon.is_none())
    else {
        return path;
    };
    let span = first.ident.span();
    if first.ident == "self" {
        first.ident = Ident::new("super", span);
    } else if first.ident == "super" {
        path.segments.insert(0, Ident::new("super", span).into());
    }
    path
}

/// Emits `fn name() -> name::Program` and `mod name { Program, Args }`.
pub fn emit(func: &syn::ItemFn, options: &Options, lowered: &Lowered) -> TokenStream {
    let name = &func.sig.ident;
    let name_str = name.to_string();
    let vis = &func.vis;
    let attrs = &func.attrs;
    let krate = in_child_module(&options.krate);
    // Handles: every input and named stage.
    let named: Vec<&Step> = lowered.steps.iter().filter(|s| s.bind.is_some()).collect();
    let build = build_body(name, options, lowered, &named);
    let program = program_struct(&name_str, options, &named);
    let args = args_struct(lowered);
    let mod_doc = format!(
        "Typed handles ([`Program`]) and run-time arguments ([`Args`]) of the coconet program `{name_str}`."
    );
    quote! {
        #(#attrs)*
        #vis fn #name() -> #name::Program {
            #build
        }

        #[doc = #mod_doc]
        #[allow(non_snake_case, dead_code)]
        #vis mod #name {
            use #krate::core as __cc;

            #program

            #args
        }
    }
}

/// The body of `fn name()`: the builder calls, each checked (the checker's errors were
/// reported at compile time), and the `Program` with the handles of `named` steps.
fn build_body(name: &Ident, options: &Options, lowered: &Lowered, named: &[&Step]) -> TokenStream {
    let name_str = name.to_string();
    let steps = &lowered.steps;
    let groups = options.groups;
    let krate = &options.krate;
    let set_groups = (groups != 1).then(|| quote!(__c(__b.set_groups(#groups));));
    let stmts = steps.iter().map(|s| {
        let var = &s.var;
        let c = call(&s.make, steps);
        let is_input = matches!(s.make, Make::TensorInput { .. } | Make::ScalarInput { .. });
        let bind = match (&s.bind, is_input) {
            (Some(b), false) => {
                let b = b.to_string();
                Some(quote!(__c(__b.bind(#var, #b));))
            }
            _ => None,
        };
        quote!(let #var = __c(#c); #bind)
    });
    let outputs = lowered.outputs.iter().map(|&i| {
        let var = &steps[i].var;
        quote!(__c(__b.output(#var));)
    });
    let handle_inits = named.iter().map(|s| {
        let field = s.bind.as_ref().expect("named");
        let var = &s.var;
        let kind = match &s.make {
            Make::TensorInput { .. } => quote!(TensorInput),
            Make::ScalarInput { .. } => quote!(ScalarInput),
            _ => quote!(Stage),
        };
        quote!(#field: __cc::handle::#kind::from_id(#var))
    });
    quote! {
        use #krate::core as __cc;
        use __cc::__private::checked as __c;
        let mut __b = __cc::ProgramBuilder::new(#name_str);
        #set_groups
        #(#stmts)*
        #(#outputs)*
        #name::Program {
            #(#handle_inits,)*
            __program: __b.finish(),
        }
    }
}

/// `Program`: the checked program with a typed handle for every `named` step, and a
/// method per schedule the attribute names.
fn program_struct(name_str: &str, options: &Options, named: &[&Step]) -> TokenStream {
    let handle_fields = named.iter().map(|s| {
        let field = s.bind.as_ref().expect("named");
        let el = element(s.dtype);
        let (kind, doc) = match &s.make {
            Make::TensorInput { .. } => (
                quote!(TensorInput),
                format!("Tensor input `{field}`: {}.", s.doc),
            ),
            Make::ScalarInput { .. } => (
                quote!(ScalarInput),
                format!("Scalar input `{field}`: {}.", s.dtype),
            ),
            _ => (quote!(Stage), format!("Stage `{field}`: {}.", s.doc)),
        };
        quote!(#[doc = #doc] pub #field: __cc::handle::#kind<#el>)
    });
    let prog_doc = format!(
        "The checked `{name_str}` program with a typed handle for every input and named stage."
    );
    let schedule_fns = options.schedules.iter().map(|sch| {
        let fname = &sch.name;
        let sname = fname.to_string();
        let steps = sch.steps.iter().map(crate::schedule::written_tokens);
        let doc = format!(
            "The schedule `{sname}` named in the `#[coconet]` attribute (applied at compile time): {}.",
            sch.steps.iter().map(|w| w.tokens.to_string()).collect::<Vec<_>>().join(", ")
        );
        quote! {
            #[doc = #doc]
            pub fn #fname(&self) -> __cc::Schedule {
                __cc::__private::checked_schedule(__cc::Schedule::from_written(
                    &self.__program,
                    #sname,
                    &[#(#steps),*],
                ))
            }
        }
    });
    quote! {
        #[doc = #prog_doc]
        #[derive(Debug, Clone)]
        pub struct Program {
            #(#handle_fields,)*
            pub(super) __program: __cc::Program,
        }

        impl Program {
            #(#schedule_fns)*

            /// The checked program.
            pub fn program(&self) -> &__cc::Program {
                &self.__program
            }

            /// Runs the program on the reference interpreter with `ranks` ranks.
            pub fn interpret(&self, ranks: usize, args: Args) -> ::std::result::Result<__cc::Execution, __cc::InterpError> {
                __cc::interpret(&self.__program, ranks, &args.into())
            }
        }

        impl ::std::ops::Deref for Program {
            type Target = __cc::Program;
            fn deref(&self) -> &__cc::Program {
                &self.__program
            }
        }
    }
}

/// `Args`: the run-time arguments by name (dims, then inputs in declaration order), and
/// their conversion into `Bindings`.
fn args_struct(lowered: &Lowered) -> TokenStream {
    let dim_fields: Vec<Ident> = lowered
        .dims
        .iter()
        .map(|d| Ident::new(d, Span::call_site()))
        .collect();
    let dim_docs = lowered
        .dims
        .iter()
        .map(|d| format!("Size of dimension `{d}`."));
    let inputs: Vec<&Step> = lowered
        .steps
        .iter()
        .filter(|s| matches!(s.make, Make::TensorInput { .. } | Make::ScalarInput { .. }))
        .collect();
    let arg_fields = inputs.iter().map(|s| {
        let field = s.bind.as_ref().expect("inputs are named");
        let el = element(s.dtype);
        match &s.make {
            Make::TensorInput { .. } => {
                let doc = format!("Data of tensor input `{field}` ({}).", s.doc);
                quote!(#[doc = #doc] pub #field: __cc::interp::TensorArg<#el>)
            }
            _ => {
                let doc = format!("Value of scalar input `{field}`.");
                quote!(#[doc = #doc] pub #field: #el)
            }
        }
    });
    let arg_binds = inputs.iter().map(|s| {
        let field = s.bind.as_ref().expect("inputs are named");
        let f = field.to_string();
        match &s.make {
            Make::TensorInput { .. } => quote!(.tensor(#f, a.#field)),
            _ => quote!(.scalar(#f, a.#field)),
        }
    });
    let dim_binds = lowered
        .dims
        .iter()
        .zip(&dim_fields)
        .map(|(d, f)| quote!(.dim(#d, a.#f)));
    quote! {
        /// Run-time arguments, by name: symbolic dims, tensor data and scalars.
        #[derive(Debug, Clone)]
        pub struct Args {
            #(#[doc = #dim_docs] pub #dim_fields: usize,)*
            #(#arg_fields,)*
        }

        impl ::std::convert::From<Args> for __cc::Bindings {
            fn from(a: Args) -> __cc::Bindings {
                __cc::Bindings::new()
                    #(#dim_binds)*
                    #(#arg_binds)*
            }
        }
    }
}
