//! The `#[coconet]` attribute macro.
//!
//! Thin by design: it parses the function ([`signature`], [`lower`]), drives
//! `coconet_core::ProgramBuilder` — the checker — at compile time, turns every
//! [`coconet_core::CheckError`] into a spanned compile error (all of them, not just the
//! first), and emits code ([`emit`]) that builds the same program at run time, together
//! with typed handles and a typed argument struct.

mod emit;
mod lower;
mod schedule;
mod signature;
mod suggest;

use proc_macro::TokenStream;

/// Turns a training step into a checked coconet program.
///
/// See the `coconet` crate documentation for the language. The attribute's arguments,
/// comma-separated, each at most once:
///
/// - `groups = G`: the number of process groups (pipeline stages), 1 unless given.
/// - `schedule(name = [steps], ...)`: schedules applied at compile time, each a method
///   `name()` of the generated `Program`.
/// - `crate = path`: the path the generated code names the `coconet` crate by,
///   `::coconet` unless given — as serde's `#[serde(crate = "...")]`, but a path rather
///   than a string. For a crate that has coconet under another name or through a
///   re-export (`crate = my_crate::coconet`), or coconet's own crate (`crate = crate`).
///   The path is written as a `use` at the item's place would write it, except that a
///   path into this crate starts with `crate::`, `self::` or `super::`. The generated
///   code uses only `path::core` (coconet-core), so a crate that depends on coconet-core
///   and coconet-macros alone names a module holding `pub use coconet_core as core;`.
#[proc_macro_attribute]
pub fn coconet(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand(attr.into(), item.into())
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// The whole expansion on `proc_macro2` tokens, callable from unit tests.
fn expand(
    attr: proc_macro2::TokenStream,
    item: proc_macro2::TokenStream,
) -> syn::Result<proc_macro2::TokenStream> {
    let options = signature::parse_options(attr)?;
    let func: syn::ItemFn = syn::parse2(item)?;
    let (lowered, error) = lower::lower(&func, &options);
    let items = emit::emit(&func, &options, &lowered);
    // On a checker error the items are still emitted, from what did check, beside the
    // errors: the rest of the crate keeps resolving the function, its handles and its
    // `Args` (rust-analyzer too), so the errors shown are this function's own.
    Ok(match error {
        None => items,
        Some(e) => {
            let e = e.into_compile_error();
            quote::quote!(#e #items)
        }
    })
}

#[cfg(test)]
mod tests;
