//! The `#[coconet]` attribute macro.
use proc_macro::TokenStream;

/// Placeholder.
#[proc_macro_attribute]
pub fn coconet(_attr: TokenStream, item: TokenStream) -> TokenStream {
    item
}
