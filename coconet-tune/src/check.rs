//! The tuner's proof that a contender computes the program: on the reference
//! interpreter at small dims, and at full size against the program as written.

use coconet_core::{
    Binding, Bindings, DType, Execution, Layout, Op, Program, Schedule, ValueId,
    numerics::tensor::numel,
};
use coconet_plan::backend::{Backend, JobData};
use coconet_plan::{Plan, RuntimeError};

/// The program as written, run by the reference interpreter on a small instance: its
/// symbolic dims shrunk to at most 3P + 2 (blocks of unequal sizes), the user's
/// scalars, and generated tensors in the inputs' dtypes.
pub(crate) struct Reference<'a> {
    program: &'a Program,
    ranks: usize,
    small: Bindings,
    want: Execution,
}

impl<'a> Reference<'a> {
    pub(crate) fn new(
        program: &'a Program,
        ranks: usize,
        bindings: &Bindings,
    ) -> Result<Reference<'a>, RuntimeError> {
        let mut small = bindings.clone();
        for (_, size) in small.dims_mut().iter_mut() {
            *size = (*size).min(3 * ranks + 2);
        }
        let q = program.group_size(ranks)?;
        let mut seed = 0x5eed_u64;
        for id in program.inputs() {
            let node = program.node(id);
            if node.op != Op::TensorInput {
                continue;
            }
            let shape =
                node.ty.shape.resolve(small.dims()).map_err(|e| {
                    RuntimeError::Plan(format!("tune: `{}`: {e}", program.label(id)))
                })?;
            let n = numel(&shape);
            let mut values = |_: usize| {
                (0..n)
                    .map(|_| {
                        seed = splitmix(seed);
                        0.5 + (seed >> 11) as f64 / (1u64 << 53) as f64
                    })
                    .collect::<Vec<f64>>()
            };
            let dtype = node.ty.dtype;
            let binding = match node.ty.layout {
                Layout::Local => {
                    Binding::per_rank_as(dtype, &(0..q).map(&mut values).collect::<Vec<_>>())
                }
                _ => Binding::global_as(dtype, &values(0)),
            };
            small = small.tensor(&program.label(id), binding);
        }
        let want = coconet_core::interpret(program, ranks, &small)?;
        Ok(Reference {
            program,
            ranks,
            small,
            want,
        })
    }

    /// How contenders' results must agree at full size: bitwise when no schedule can
    /// change them (no matmul, no reduction to a scalar a schedule may split).
    pub(crate) fn exact(&self) -> bool {
        order_free(self.program)
    }

    /// Runs `schedule` on `backend` at the small dims: its results must be those of the
    /// interpreter running the same schedule (bitwise; within 2e-3 where a matmul sums in
    /// another order), and the interpreter's results for the schedule those of the
    /// program (bitwise; within 16 ulps of the dtype, relative to the tensor's largest
    /// magnitude, where the schedule may reorder a reduction). Why not, if they differ.
    pub(crate) fn check<B: Backend>(&self, schedule: &Schedule, backend: &B) -> Result<(), String> {
        let plan =
            Plan::lower(schedule, self.ranks, self.small.dims()).map_err(|e| e.to_string())?;
        let mut job = backend
            .prepare(&plan, &self.small)
            .map_err(|e| e.to_string())?;
        backend.run(&mut job).map_err(|e| e.to_string())?;
        let scheduled = coconet_core::interpret(schedule.program(), self.ranks, &self.small)
            .map_err(|e| format!("the interpreter running the schedule: {e}"))?;
        let got = self.collect(|v, r| match r {
            Some(r) => job_local(&job, self.program, v, r),
            None => job_logical(&job, self.program, v),
        });
        let on_interp = |e: &Execution| {
            self.collect(|v, r| match r {
                Some(r) => interp_local(e, self.program, v, r),
                None => interp_logical(e, self.program, v),
            })
        };
        let (mid, want) = (on_interp(&scheduled), on_interp(&self.want));
        let dims = self.small.dims();
        let matmul = self
            .program
            .ids()
            .any(|v| matches!(self.program.node(v).op, Op::MatMul(..)));
        compare(&got, &mid, |a, b, _| {
            if matmul {
                (a - b).abs() <= 2e-3 * b.abs().max(1.0)
            } else {
                a.to_bits() == b.to_bits()
            }
        })
        .map_err(|e| {
            format!(
                "{e} where the interpreter gives {}, at the dims {dims:?}",
                e.want
            )
        })?;
        let exact = order_free(self.program);
        compare(&mid, &want, |a, b, (dtype, largest)| {
            exact && a.to_bits() == b.to_bits()
                || !exact && (a - b).abs() <= 16.0 * ulp(dtype) * b.abs().max(largest)
        })
        .map_err(|e| {
            format!(
                "{e} where the program as written gives {} (the schedule changes results), at the dims {dims:?}",
                e.want
            )
        })?;
        Ok(())
    }

    /// Every result of the program, read through `read(value, Some(rank) | None)`: per
    /// rank where the program's value is Local, else the logical value (a schedule may
    /// slice what the program replicates).
    fn collect(&self, read: impl Fn(ValueId, Option<usize>) -> Option<Vec<f64>>) -> Vec<Read> {
        let p = self.program;
        let mut out = Vec::new();
        for (v, name, local) in results(p) {
            let dtype = p.node(v).ty.dtype;
            if local {
                for r in 0..self.ranks {
                    out.push(Read {
                        name: format!("`{name}` on rank {r}"),
                        dtype,
                        data: read(v, Some(r)),
                    });
                }
            } else {
                out.push(Read {
                    name: format!("`{name}`"),
                    dtype,
                    data: read(v, None),
                });
            }
        }
        out
    }
}

/// One result as read from a job or an interpreter run.
struct Read {
    name: String,
    dtype: DType,
    data: Option<Vec<f64>>,
}

/// Where two lists of results first differ.
struct Mismatch {
    what: String,
    want: String,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.what)
    }
}

/// Compares `got` with `want` element by element (`same(a, b, (dtype, largest |want|))`;
/// NaN equals NaN).
fn compare(
    got: &[Read],
    want: &[Read],
    same: impl Fn(f64, f64, (DType, f64)) -> bool,
) -> Result<(), Mismatch> {
    for (g, w) in got.iter().zip(want) {
        match (&g.data, &w.data) {
            (None, None) => {}
            (Some(a), Some(b)) if a.len() == b.len() => {
                let largest = b.iter().fold(0f64, |m, x| m.max(x.abs()));
                if let Some(i) = (0..a.len()).find(|&i| {
                    !(a[i].is_nan() && b[i].is_nan() || same(a[i], b[i], (w.dtype, largest)))
                }) {
                    return Err(Mismatch {
                        what: format!("{}[{i}] is {}", g.name, a[i]),
                        want: b[i].to_string(),
                    });
                }
            }
            (a, b) => {
                let count =
                    |x: &Option<Vec<f64>>| x.as_ref().map_or("no".into(), |x| x.len().to_string());
                return Err(Mismatch {
                    what: format!("{} has {} values", g.name, count(a)),
                    want: count(b),
                });
            }
        }
    }
    Ok(())
}

/// The spacing of the dtype's values at 1.
fn ulp(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 2f64.powi(-10),
        DType::BF16 => 2f64.powi(-7),
        DType::F32 => 2f64.powi(-23),
        DType::F64 => 2f64.powi(-52),
        DType::I32 | DType::I64 | DType::Bool => 0.0,
    }
}

/// The program's results: every updated input and every output, with its label and
/// whether it is Local (a value per rank).
fn results(p: &Program) -> Vec<(ValueId, String, bool)> {
    p.updates()
        .map(|(t, _)| t)
        .chain(p.outputs().iter().copied())
        .map(|v| (v, p.label(v), p.node(v).ty.layout == Layout::Local))
        .collect()
}

/// Whether no schedule of `p` can change its results (no matmul, no reduction to a
/// scalar a schedule may split): contenders must then agree bit for bit.
fn order_free(p: &Program) -> bool {
    !p.ids()
        .any(|v| matches!(p.node(v).op, Op::MatMul(..) | Op::ReduceAll(..)))
}

fn is_input(p: &Program, v: ValueId) -> bool {
    p.node(v).op == Op::TensorInput
}

fn job_local<J: JobData>(job: &J, p: &Program, v: ValueId, r: usize) -> Option<Vec<f64>> {
    if is_input(p, v) {
        job.final_input_local(&p.label(v), r).ok()
    } else {
        job.local(v, r)
    }
}

fn job_logical<J: JobData>(job: &J, p: &Program, v: ValueId) -> Option<Vec<f64>> {
    if is_input(p, v) {
        job.final_input(&p.label(v)).ok()
    } else {
        job.logical(v).ok()
    }
}

fn interp_local(e: &Execution, p: &Program, v: ValueId, r: usize) -> Option<Vec<f64>> {
    if is_input(p, v) {
        e.final_input_local(&p.label(v), r).ok()
    } else {
        e.local(v, r)
    }
}

fn interp_logical(e: &Execution, p: &Program, v: ValueId) -> Option<Vec<f64>> {
    if is_input(p, v) {
        e.final_input(&p.label(v)).ok()
    } else {
        e.logical(v).ok()
    }
}

/// A hash of every updated input and output of `program` on every rank of `job` (NaNs
/// alike), to compare contenders at full size without keeping a copy of the model.
pub(crate) fn state_hash<J: JobData>(job: &J, program: &Program, ranks: usize) -> u64 {
    let mut h = super::cache::Fnv::new();
    for (v, _, local) in results(program) {
        if local {
            for r in 0..ranks {
                hash_values(&mut h, job_local(job, program, v, r).as_deref());
            }
        } else {
            hash_values(&mut h, job_logical(job, program, v).as_deref());
        }
    }
    h.finish()
}

fn hash_values(h: &mut super::cache::Fnv, values: Option<&[f64]>) {
    let Some(values) = values else {
        h.write(&[0]);
        return;
    };
    h.write(&[1]);
    h.write(&(values.len() as u64).to_le_bytes());
    for &x in values {
        let bits = if x.is_nan() {
            f64::NAN.to_bits()
        } else {
            x.to_bits()
        };
        h.write(&bits.to_le_bytes());
    }
}

/// SplitMix64: the generated tensors' values (fixed, so every contender sees the same).
fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
