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
/// See the `coconet` crate documentation for the language.
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
    let lowered = lower::lower(&func, &options)?;
    Ok(emit::emit(&func, &options, &lowered))
}

#[cfg(test)]
mod tests;
