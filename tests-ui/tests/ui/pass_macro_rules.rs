//! `#[coconet]` inside `macro_rules!`: dtypes and shapes passed as `$t:ty` arrive in
//! invisible groups, which the macro looks through.
use coconet::prelude::*;

macro_rules! scaled {
    ($name:ident, $t:ty, $shape:ty) => {
        #[coconet]
        fn $name(x: Tensor<$t, Replicated, $shape>, s: $t) {
            let y = x * s;
            let z = cast::<$t>(y);
            z
        }
    };
}

scaled!(scale32, f32, [N]);
scaled!(scale64, f64, (B, N));

fn main() {
    assert_eq!(scale32().program().name(), "scale32");
    assert_eq!(scale64().program().name(), "scale64");
}
