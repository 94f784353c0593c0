//! The linear layers' matmuls overlapped with their all-reduces (the paper's overlap of
//! Megatron-LM's layer), as candle custom ops over `(x, weight)` so that one op sees
//! both the product and its collective:
//!
//! - [`row_parallel_overlapped`], forward: the partial product `x·Wᵀ` computed in row
//!   chunks, each chunk's all-reduce started on the rank's communication thread as soon
//!   as the chunk is done, while the next chunk's product is computed; backward: the
//!   gradients of `x·Wᵀ` (the all-reduce's backward is the identity).
//! - [`column_parallel_overlapped`], forward: `x·Wᵀ`; backward: the input's partial
//!   gradient `∂y·W` started on its all-reduce first, the weight's gradient `∂yᵀ·x`
//!   computed while it runs (as Megatron-LM overlaps them).
//!
//! Each equals the layer's plain forward and backward up to the matmul's blocking over
//! rows (a row's products and the sums over ranks are the same).

use super::collective::Collective;
use super::group::{Pending, TensorParallel};
use super::storage::f32_data;
use candle_core::{CpuStorage, CustomOp2, Device, Layout, Result, Shape, Tensor};

/// `Σ_ranks x·weightᵀ` with `chunks` row chunks in flight (see the module docs): `x`
/// `[.., I/P]`, `weight` `[O, I/P]`, gives `[.., O]`, the same on every rank.
pub(crate) fn row_parallel_overlapped(
    x: &Tensor,
    weight: &Tensor,
    tp: &TensorParallel,
    chunks: usize,
) -> Result<Tensor> {
    on_the_cpu(x, "with_overlap (a row-parallel layer)")?;
    x.contiguous()?.apply_op2(
        &weight.contiguous()?,
        RowOverlapped {
            tp: tp.clone(),
            chunks: chunks.max(1),
        },
    )
}

/// `x·weightᵀ` whose backward overlaps the input gradient's all-reduce with the
/// weight's gradient (see the module docs): `x` `[.., I]` (the same on every rank),
/// `weight` `[O/P, I]`, gives this rank's `[.., O/P]`.
pub(crate) fn column_parallel_overlapped(
    x: &Tensor,
    weight: &Tensor,
    tp: &TensorParallel,
) -> Result<Tensor> {
    on_the_cpu(x, "with_overlap (a column-parallel layer)")?;
    x.contiguous()?
        .apply_op2(&weight.contiguous()?, ColumnOverlapped(tp.clone()))
}

/// An error for a tensor elsewhere than on the CPU: the overlapped layers' forward runs
/// candle's CPU matmuls between the collectives.
fn on_the_cpu(x: &Tensor, what: &str) -> Result<()> {
    if !x.device().is_cpu() {
        candle_core::bail!(
            "{what}: the overlapped layers run on the CPU only, got a tensor on {:?}; on a \
             GPU use the layers without with_overlap",
            x.device()
        );
    }
    Ok(())
}

/// `x` `[.., K]` as a matrix `[M, K]` and the weight `[O, K]`, copied out of candle's
/// storages into tensors of their own (a custom op's forward gets only the storages).
fn operands(
    (x, xl): (&CpuStorage, &Layout),
    (w, wl): (&CpuStorage, &Layout),
    what: &str,
) -> Result<(Tensor, Tensor, Vec<usize>)> {
    let (x_data, w_data) = (f32_data(x, xl, what)?, f32_data(w, wl, what)?);
    let (o, k) = wl.shape().dims2()?;
    let dims = xl.shape().dims().to_vec();
    if dims.last() != Some(&k) {
        candle_core::bail!("{what}: an input of shape {dims:?} for a weight of shape [{o}, {k}]");
    }
    let m = x_data.len() / k.max(1);
    let x = Tensor::from_slice(x_data, (m, k), &Device::Cpu)?;
    let w = Tensor::from_slice(w_data, (o, k), &Device::Cpu)?;
    let mut out = dims;
    *out.last_mut().expect("checked above") = o;
    Ok((x, w, out))
}

/// The gradients of `x·weightᵀ` for the output's gradient `grad`: `(∂y·W, ∂yᵀ·x)`, each
/// in its argument's shape; the input's first, so it can be sent while the weight's is
/// computed.
fn input_gradient(x: &Tensor, weight: &Tensor, grad: &Tensor) -> Result<Tensor> {
    let o = weight.dim(0)?;
    let g = grad.reshape(((), o))?;
    g.matmul(weight)?.reshape(x.shape())
}

fn weight_gradient(x: &Tensor, weight: &Tensor, grad: &Tensor) -> Result<Tensor> {
    let (o, k) = weight.dims2()?;
    let g = grad.reshape(((), o))?;
    g.t()?.matmul(&x.reshape(((), k))?)
}

fn collective_error(what: &str) -> impl Fn(coconet_runtime::RuntimeError) -> candle_core::Error {
    let what = what.to_string();
    move |e| candle_core::Error::Msg(format!("{what}: {e}"))
}

/// The op behind [`row_parallel_overlapped`].
struct RowOverlapped {
    tp: TensorParallel,
    chunks: usize,
}

impl CustomOp2 for RowOverlapped {
    fn name(&self) -> &'static str {
        "coconet-row-parallel-overlapped"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        xl: &Layout,
        w: &CpuStorage,
        wl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (x, w, out) = operands((x, xl), (w, wl), self.name())?;
        let m = x.dim(0)?;
        let rows = m.div_ceil(self.chunks).max(1);
        let wt = w.t()?;
        let mut pending: Vec<Pending> = Vec::with_capacity(self.chunks);
        let mut at = 0;
        while at < m {
            let len = rows.min(m - at);
            let part = x.narrow(0, at, len)?.matmul(&wt)?;
            let data = part.flatten_all()?.to_vec1::<f32>()?;
            pending.push(
                self.tp
                    .start(Collective::Sum, data)
                    .map_err(collective_error("coconet all-reduce"))?,
            );
            at += len;
        }
        let mut y = Vec::with_capacity(out.iter().product());
        for p in pending {
            y.extend(p.wait().map_err(collective_error("coconet all-reduce"))?);
        }
        Ok((CpuStorage::F32(y), Shape::from(out)))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        Ok((
            Some(input_gradient(x, w, grad)?),
            Some(weight_gradient(x, w, grad)?),
        ))
    }
}

/// The op behind [`column_parallel_overlapped`].
struct ColumnOverlapped(TensorParallel);

impl CustomOp2 for ColumnOverlapped {
    fn name(&self) -> &'static str {
        "coconet-column-parallel-overlapped"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        xl: &Layout,
        w: &CpuStorage,
        wl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (x, w, out) = operands((x, xl), (w, wl), self.name())?;
        let y = x.matmul(&w.t()?)?.flatten_all()?.to_vec1::<f32>()?;
        Ok((CpuStorage::F32(y), Shape::from(out)))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let partial = input_gradient(x, w, grad)?;
        let data = partial.flatten_all()?.to_vec1::<f32>()?;
        let pending = self
            .0
            .start(Collective::Sum, data)
            .map_err(collective_error("coconet all-reduce of an input gradient"))?;
        let dw = weight_gradient(x, w, grad)?;
        let dx = pending
            .wait()
            .map_err(collective_error("coconet all-reduce of an input gradient"))?;
        Ok((Some(Tensor::from_vec(dx, x.shape(), x.device())?), Some(dw)))
    }
}
