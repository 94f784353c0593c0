//! Expansion snapshots.
use quote::quote;

fn expand(attr: proc_macro2::TokenStream, item: proc_macro2::TokenStream) -> String {
    let tokens = crate::expand(attr, item).expect("expands");
    prettyplease::unparse(&syn::parse2(tokens).expect("valid file"))
}

#[test]
fn sgd_expansion() {
    insta::assert_snapshot!(expand(
        quote!(),
        quote! {
            /// Plain SGD.
            pub fn sgd(g: Tensor<f32, Local, [N]>, w: Tensor<f32, Replicated, [N]>, lr: f32) {
                let g1 = all_reduce(Sum, g);
                let w1 = update(w, w - lr * g1);
            }
        }
    ));
}

#[test]
fn pipeline_expansion() {
    insta::assert_snapshot!(expand(
        quote!(groups = 2),
        quote! {
            fn stage(x: Tensor<f16, Local, (B, H)>, b: Tensor<f16, Replicated, [H]>, seed: i64) {
                let s = all_reduce(Sum, x);
                let y = dropout(s + b, 0.1, seed);
                let out = send(y, Next);
                out
            }
        }
    ));
}

#[test]
fn errors_are_all_reported_and_the_items_still_emitted() {
    let item = quote! {
        fn bad(g: Tensor<f32, Local, [N]>) {
            let a = all_gather(g);
            let b = sqrtt(g);
            let c = nope + g;
        }
    };
    let func: syn::ItemFn = syn::parse2(item.clone()).unwrap();
    let options = crate::signature::parse_options(quote!()).unwrap();
    let (_, err) = crate::lower::lower(&func, &options);
    let msgs: Vec<String> = err.unwrap().into_iter().map(|e| e.to_string()).collect();
    assert_eq!(msgs.len(), 3, "{msgs:?}");
    assert!(msgs[0].contains("all_gather` needs a Sliced operand"));
    assert!(msgs[1].contains("did you mean `sqrt`"));
    assert!(msgs[2].contains("cannot find `nope`"));
    // The expansion: the three errors, then the function, its handles and its `Args`
    // from what checked (the input `g`), so the rest of the crate still resolves them.
    let code = crate::expand(quote!(), item).unwrap().to_string();
    assert_eq!(code.matches("compile_error").count(), 3, "{code}");
    assert!(
        code.contains("fn bad") && code.contains("mod bad"),
        "{code}"
    );
    assert!(code.contains("pub g :"), "{code}");
}

#[test]
fn tuple_of_outputs() {
    let code = expand(
        quote!(),
        quote! {
            fn two(x: Tensor<f32, Local, [N]>) {
                let a = all_reduce(Sum, x);
                let b = all_reduce(Max, x);
                (a, b)
            }
        },
    );
    assert_eq!(code.matches("__b.output(").count(), 2, "{code}");
    assert!(code.contains("__c(__b.output(a));") && code.contains("__c(__b.output(b));"));
}

#[test]
fn crate_path_names_coconet_in_both_scopes() {
    let item = quote! {
        fn step(g: Tensor<f32, Local, [N]>) {
            let s = all_reduce(Sum, g);
            s
        }
    };
    let uses = |attr| {
        let code = expand(attr, item.clone());
        code.lines()
            .filter(|l| l.contains("::core as __cc;"))
            .map(|l| l.trim().to_owned())
            .collect::<Vec<_>>()
    };
    // The builder function is at the item's place, the handles' module one level below.
    let default = ["use ::coconet::core as __cc;"; 2];
    assert_eq!(uses(quote!()), default);
    assert_eq!(
        uses(quote!(crate = my_crate::cn)),
        ["use my_crate::cn::core as __cc;"; 2]
    );
    assert_eq!(
        uses(quote!(crate = self::cn)),
        [
            "use self::cn::core as __cc;",
            "use super::cn::core as __cc;"
        ]
    );
    assert_eq!(
        uses(quote!(crate = super::cn)),
        [
            "use super::cn::core as __cc;",
            "use super::super::cn::core as __cc;"
        ]
    );
    assert_eq!(uses(quote!(crate = crate)), ["use crate::core as __cc;"; 2]);
}
