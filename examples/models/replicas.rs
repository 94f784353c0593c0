//! What the candle training examples share: replicas of a model with one template's
//! weights, deterministic initial weights, and comparing replicas and loss curves.

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};

/// A model built by `build` whose weights are copied from `template`, and its
/// parameters in name order (the same order on every replica).
pub fn replica<M>(
    template: &VarMap,
    build: impl Fn(VarBuilder) -> candle_core::Result<M>,
) -> candle_core::Result<(M, Vec<Var>)> {
    replica_on(&Device::Cpu, template, build)
}

/// [`replica`] with its weights on `device` (the template's copied there).
pub fn replica_on<M>(
    device: &Device,
    template: &VarMap,
    build: impl Fn(VarBuilder) -> candle_core::Result<M>,
) -> candle_core::Result<(M, Vec<Var>)> {
    let vm = VarMap::new();
    let model = build(VarBuilder::from_varmap(&vm, DType::F32, device))?;
    let theirs = template.data().lock().expect("varmap");
    let mine = vm.data().lock().expect("varmap");
    let mut names: Vec<&String> = mine.keys().collect();
    names.sort();
    let mut vars = Vec::new();
    for name in names {
        mine[name].set(&theirs[name].as_tensor().to_device(device)?)?;
        vars.push(mine[name].clone());
    }
    Ok((model, vars))
}

/// Deterministic initial weights (candle's own initialisation draws from an unseeded
/// generator): every parameter for which `bound(name, var)` gives a bound is drawn
/// uniform in ±bound from a fixed sequence, in name order, so every run trains the same
/// way; the others keep candle's (deterministic) values, e.g. layer norms' ones and
/// zeros.
pub fn initialise(
    template: &VarMap,
    seed: u64,
    bound: impl Fn(&str, &Var) -> Option<f32>,
) -> candle_core::Result<()> {
    let vars = template.data().lock().expect("varmap");
    let mut names: Vec<&String> = vars.keys().collect();
    names.sort();
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for name in names {
        let var = &vars[name];
        let Some(bound) = bound(name, var) else {
            continue;
        };
        let values: Vec<f32> = (0..var.elem_count())
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * bound
            })
            .collect();
        var.set(&Tensor::from_vec(values, var.shape(), &Device::Cpu)?)?;
    }
    Ok(())
}

/// The bits of every weight, to compare replicas exactly.
pub fn weight_bits(vars: &[Var]) -> candle_core::Result<Vec<u32>> {
    let mut bits = Vec::new();
    for v in vars {
        bits.extend(
            v.as_tensor()
                .flatten_all()?
                .to_vec1::<f32>()?
                .iter()
                .map(|x| x.to_bits()),
        );
    }
    Ok(bits)
}

/// The largest deviation of `got` from `want`, relative, or absolute below `floor` (a
/// relative error of a loss near 0 says nothing).
pub fn deviation(got: &[f32], want: &[f32], floor: f32) -> f32 {
    got.iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs() / b.abs().max(floor))
        .fold(0.0f32, f32::max)
}
