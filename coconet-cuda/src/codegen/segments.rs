//! Segmented twins of elementwise kernels: one launch over many separately allocated
//! pieces of a buffer (a model's parameter tensors lent as pieces), as torch's
//! multi-tensor apply steps a tensor list.
//!
//! An elementwise kernel (`lo, hi` first, no cooperation between threads) becomes a
//! device function `NAME_body(t, n, …)` — its grid-stride loops over threads `t` of `n`
//! — with two kernels around it: `NAME` (the plain launch, the same parameters: every
//! thread of the grid, `t` its index) and `NAME_segs(segs, nsegs, scalars…)`, where each
//! block takes rows of a table (`lo, hi` and the pointers: `2 + pointers` words per row)
//! and runs the body over that row with its own threads, as torch's multi-tensor apply
//! gives each block a chunk of one tensor. The executor cuts a launch's positions where
//! any lent piece begins and into chunks of [`CHUNK`], so within a row every pointer
//! addresses one piece, and position `i` of the body reads element `i` of each pointer as
//! before: the same arithmetic in the same order, so results stay bitwise those of a
//! contiguous buffer; a thread never looks at rows that are not its block's.

/// Positions per row of a segment table at most: a block of 256 threads does 8 of its
/// vector loop's iterations per row.
pub(crate) const CHUNK: usize = 8192;

/// Whether a kernel with these parameters and this source can have a segmented twin:
/// elementwise (its threads only in grid-stride loops; a kernel singling out one thread
/// of the grid, `cc_tid() == 0`, would run that thread's work once per row).
pub(crate) fn segmentable(params: &[String], per_block: bool, source: &str) -> bool {
    !per_block
        && params.len() > 2
        && params[0] == "cc_i64"
        && params[1] == "cc_i64"
        && params.iter().any(|t| is_pointer(t))
        && !source.contains("cc_tid() ==")
}

/// Whether a parameter's C type is a pointer (read from the segment table).
pub(crate) fn is_pointer(ty: &str) -> bool {
    ty.contains('*')
}

/// `source` (the kernel `name`) rewritten as its body function, the plain kernel and
/// the segmented twin `name_segs`; the twin's parameter types.
pub(crate) fn with_twin(source: &str, name: &str, params: &[String]) -> (String, Vec<String>) {
    let head = format!("CC_KERNEL {name}(");
    let mut out = source
        .replacen(
            &head,
            &format!("CC_DEV void {name}_body(cc_i64 cc_t, cc_i64 cc_n, "),
            1,
        )
        .replace("cc_tid()", "cc_t")
        .replace("cc_nthreads()", "cc_n");
    let names: Vec<String> = (0..params.len()).map(|j| format!("p{j}")).collect();
    let decl: Vec<String> = params
        .iter()
        .zip(&names)
        .map(|(t, n)| format!("{t} {n}"))
        .collect();
    out.push_str(&format!(
        "CC_KERNEL {name}({}) {{ {name}_body(cc_tid(), cc_nthreads(), {}); }}\n",
        decl.join(", "),
        names.join(", ")
    ));
    let width = 2 + params[2..].iter().filter(|t| is_pointer(t)).count();
    let mut twin_params = vec!["const cc_u64*".to_string(), "cc_i64".to_string()];
    let mut twin_decl = vec![
        "const cc_u64* __restrict__ cc_segs".to_string(),
        "cc_i64 cc_nsegs".to_string(),
    ];
    let mut call = vec![
        "threadIdx.x".to_string(),
        "blockDim.x".to_string(),
        "(cc_i64)cc_g[0]".to_string(),
        "(cc_i64)cc_g[1]".to_string(),
    ];
    let mut word = 2;
    for (t, n) in params.iter().zip(&names).skip(2) {
        if is_pointer(t) {
            call.push(format!("({t})cc_g[{word}]"));
            word += 1;
        } else {
            call.push(n.clone());
            twin_params.push(t.clone());
            twin_decl.push(format!("{t} {n}"));
        }
    }
    out.push_str(&format!(
        "CC_KERNEL {name}_segs({}) {{\n  for (cc_i64 cc_s = blockIdx.x; cc_s < cc_nsegs; cc_s += gridDim.x) {{\n    const cc_u64* cc_g = cc_segs + cc_s * {width};\n    {name}_body({});\n  }}\n}}\n",
        twin_decl.join(", "),
        call.join(", ")
    ));
    (out, twin_params)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_gets_a_body_a_plain_launch_and_a_segmented_twin() {
        let src = "CC_KERNEL k(cc_i64 lo, cc_i64 hi, float const* __restrict__ a1, double a2, float* __restrict__ a3) {\n  for (cc_i64 i = lo + cc_tid(); i < hi; i += cc_nthreads()) a3[i] = a1[i] * a2;\n}\n";
        let params: Vec<String> = ["cc_i64", "cc_i64", "float const*", "double", "float*"]
            .map(String::from)
            .to_vec();
        assert!(segmentable(&params, false, src));
        assert!(!segmentable(&params, true, src));
        assert!(!segmentable(
            &params,
            false,
            "  if (cc_tid() == 0) { out[0] = in[0]; }"
        ));
        let (out, twin) = with_twin(src, "k", &params);
        assert!(
            out.starts_with("CC_DEV void k_body(cc_i64 cc_t, cc_i64 cc_n, cc_i64 lo"),
            "{out}"
        );
        assert!(out.contains("i = lo + cc_t; i < hi; i += cc_n)"), "{out}");
        assert!(out.contains("CC_KERNEL k(cc_i64 p0, cc_i64 p1, float const* p2, double p3, float* p4) { k_body(cc_tid(), cc_nthreads(), p0, p1, p2, p3, p4); }"), "{out}");
        assert!(
            out.contains(
                "CC_KERNEL k_segs(const cc_u64* __restrict__ cc_segs, cc_i64 cc_nsegs, double p3)"
            ),
            "{out}"
        );
        assert!(out.contains("cc_segs + cc_s * 4"), "{out}");
        assert!(
            out.contains("cc_s = blockIdx.x; cc_s < cc_nsegs; cc_s += gridDim.x"),
            "{out}"
        );
        assert!(out.contains("k_body(threadIdx.x, blockDim.x, (cc_i64)cc_g[0], (cc_i64)cc_g[1], (float const*)cc_g[2], p3, (float*)cc_g[3]);"), "{out}");
        assert_eq!(twin, ["const cc_u64*", "cc_i64", "double"]);
    }
}
