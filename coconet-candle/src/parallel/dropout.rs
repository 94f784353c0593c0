//! Dropout whose mask is a function of the element's place in the *whole* tensor: keep
//! element `i` of the logical tensor iff `philox(seed, i) ≥ p·2³²` (coconet's `dropout`,
//! the same on every backend and schedule), scaled by `1/(1 − p)`. A rank holding a
//! slice of a tensor (its heads of the attention probabilities, its block of the tokens)
//! or the whole of a replicated one draws exactly the elements the single-device model
//! draws there, so a tensor-parallel model with dropout equals the single-device model
//! with this dropout — and the fused epilogue's `dropout` inside a coconet program draws
//! the same mask too.
//!
//! Going back, the gradient goes through the same mask and scale.

use super::storage::f32_data;
use candle_core::{CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor};
use coconet_core::numerics::philox::{dropout_bits, dropout_threshold};

/// A dropout draw: drop probability `p` (in `[0, 1)`) and the seed of this use (change it
/// every step; [`Dropout::site`] derives one per place in the model). Only the seed's low
/// 53 bits count.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dropout {
    /// The probability of dropping an element.
    pub p: f32,
    /// The counter-based RNG's key.
    pub seed: u64,
}

impl Dropout {
    /// The draw for place `site` of a model (a layer's attention probabilities, its
    /// residual branch...): another seed, a function of this one and `site` only.
    pub fn site(&self, site: u64) -> Dropout {
        // splitmix64 of the pair: distinct sites get unrelated keys.
        let mut z = self
            .seed
            .wrapping_add(site.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Dropout {
            p: self.p,
            seed: z ^ (z >> 31),
        }
    }

    /// The key the mask is drawn with: the seed's low 53 bits (a program's scalars travel
    /// as f64, exact up to 2^53).
    pub(crate) fn key(&self) -> u64 {
        self.seed & ((1 << 53) - 1)
    }

    fn check(&self) -> Result<()> {
        if !(0.0..1.0).contains(&self.p) {
            candle_core::bail!("dropout probability must be in [0, 1), got {}", self.p);
        }
        Ok(())
    }
}

/// `x` (f32) with dropout `d`, `x` being the whole logical tensor (or a
/// replicated one: every rank draws the same mask).
pub fn dropout(x: &Tensor, d: &Dropout) -> Result<Tensor> {
    let dims = x.dims().to_vec();
    dropout_slice(x, d, &dims, 0, 0)
}

/// `x` (f32; on a GPU its mask is drawn on the host) with dropout `d`, `x` being the slice
/// of the logical tensor of shape `whole` that starts at `offset` along dim `dim` (the rest
/// whole): e.g. a rank's heads `[B, A/P, T, T]` of the probabilities `[B, A, T, T]` (`dim`
/// 1, `offset` `rank·A/P`), or its block of the tokens `[N/P, H]` of `[N, H]` (`dim` 0).
pub fn dropout_slice(
    x: &Tensor,
    d: &Dropout,
    whole: &[usize],
    dim: usize,
    offset: usize,
) -> Result<Tensor> {
    d.check()?;
    let local = x.dims();
    let fits = local.len() == whole.len()
        && local.iter().zip(whole).enumerate().all(|(k, (&l, &w))| {
            if k == dim {
                offset.checked_add(l).is_some_and(|end| end <= w)
            } else {
                l == w
            }
        });
    if !fits || x.dtype() != DType::F32 {
        candle_core::bail!(
            "dropout: an f32 tensor {local:?} is not a slice of {whole:?} from {offset} along dim {dim}"
        );
    }
    if d.p == 0.0 {
        return Ok(x.clone());
    }
    x.contiguous()?.apply_op1(Mask {
        d: *d,
        whole: whole.to_vec(),
        dim,
        offset,
    })
}

/// The op behind [`dropout_slice`].
#[derive(Clone)]
struct Mask {
    d: Dropout,
    whole: Vec<usize>,
    dim: usize,
    offset: usize,
}

impl Mask {
    /// `x` (the slice, contiguous) through the mask.
    fn apply(&self, x: &[f32], local: &[usize]) -> Vec<f32> {
        let threshold = dropout_threshold(f64::from(self.d.p));
        let scale = 1.0 / (1.0 - f64::from(self.d.p));
        let mut idx = vec![0usize; local.len()];
        let mut out = Vec::with_capacity(x.len());
        for &v in x {
            let mut g = 0u64;
            for (k, (&i, &w)) in idx.iter().zip(&self.whole).enumerate() {
                let i = if k == self.dim { i + self.offset } else { i };
                g = g * w as u64 + i as u64;
            }
            let keep = u64::from(dropout_bits(self.d.key(), g)) >= threshold;
            out.push(if keep {
                (f64::from(v) * scale) as f32
            } else {
                0.0
            });
            for k in (0..local.len()).rev() {
                idx[k] += 1;
                if idx[k] < local[k] {
                    break;
                }
                idx[k] = 0;
            }
        }
        out
    }
}

impl CustomOp1 for Mask {
    fn name(&self) -> &'static str {
        "coconet-dropout"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let out = self.apply(f32_data(storage, layout, "dropout")?, layout.dims());
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    }

    /// On a GPU the mask is drawn on the host: the tensor goes down and back up (correct,
    /// not fast; the fused epilogue's dropout runs on the GPU).
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::backend::{BackendDevice, BackendStorage};
        let host = storage.to_cpu_storage()?;
        let out = self.apply(f32_data(&host, layout, "dropout")?, layout.dims());
        let on_gpu = storage
            .device
            .storage_from_cpu_storage_owned(CpuStorage::F32(out))?;
        Ok((on_gpu, layout.shape().clone()))
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        grad.contiguous()?.apply_op1_no_bwd(self).map(Some)
    }
}
