//! The values of a plan's host scalars (`PlanStep::Uniform`): scalar inputs, literals and
//! arithmetic on them, computed once per run on the host by every backend alike.

use coconet_core::{Op, ValueId};
use std::collections::HashMap;

/// Computes scalar stages `vs` (scalar inputs, literals and arithmetic on them) on the
/// host, rounded to their dtypes, into `uniform`.
pub fn uniform_values(
    p: &coconet_core::Program,
    vs: &[ValueId],
    scalars: &HashMap<ValueId, f64>,
    uniform: &mut HashMap<ValueId, f64>,
) {
    for &v in vs {
        let node = p.node(v);
        let x = match node.op {
            Op::ScalarInput => scalars[&v],
            Op::Literal(x) => x,
            ref op => {
                let args: Vec<f64> = op.operands().iter().map(|o| uniform[o]).collect();
                match *op {
                    Op::Unary(u, _) => u.eval(args[0]),
                    Op::Binary(b, a, _) => b.eval(args[0], args[1], p.node(a).ty.dtype.is_int()),
                    Op::Select(..) => {
                        if args[0] != 0.0 {
                            args[1]
                        } else {
                            args[2]
                        }
                    }
                    Op::Cast(_) => args[0],
                    _ => unreachable!("uniform stages are scalar arithmetic"),
                }
            }
        };
        uniform.insert(v, node.ty.dtype.round(x));
    }
}
