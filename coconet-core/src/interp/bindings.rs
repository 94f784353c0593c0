//! Run-time values for a program's inputs: symbolic dims, scalars and tensors.

use crate::{DType, Element, HostData};
use std::collections::BTreeMap;

/// How a tensor input is supplied.
#[derive(Debug, Clone, PartialEq)]
pub enum TensorArg<T> {
    /// The whole logical tensor. Replicated and Local inputs get a copy on every rank of
    /// the group; a Sliced input is split into per-rank blocks.
    Global(Vec<T>),
    /// One buffer per rank of the tensor's group, in rank order: the whole tensor for
    /// Replicated (all identical) and Local inputs, the rank's block for Sliced inputs.
    PerRank(Vec<Vec<T>>),
    /// This process's rank's buffer only (what [`TensorArg::PerRank`] would give for
    /// it): a multi-process backend's process binds its own gradient, not every rank's.
    /// Only backends that run one rank per process accept it.
    ThisRank(Vec<T>),
}

/// A [`TensorArg`]'s data, kept in its dtype.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Supplied {
    Global(HostData),
    PerRank(Vec<HostData>),
    ThisRank(HostData),
}

/// An untyped tensor binding: its dtype and its values, kept in that dtype.
#[derive(Debug, Clone, PartialEq)]
pub struct Binding {
    pub(crate) dtype: DType,
    pub(crate) data: Supplied,
    /// For a tensor given as separate pieces (a model's many parameter tensors): their
    /// lengths, in order; `Err` names the rank whose pieces differ from rank 0's.
    pub(crate) pieces: Option<Result<Vec<usize>, usize>>,
}

impl<T: Element> From<TensorArg<T>> for Binding {
    fn from(a: TensorArg<T>) -> Binding {
        let conv = HostData::from_vec::<T>;
        Binding {
            dtype: T::DTYPE,
            data: match a {
                TensorArg::Global(v) => Supplied::Global(conv(v)),
                TensorArg::PerRank(v) => Supplied::PerRank(v.into_iter().map(conv).collect()),
                TensorArg::ThisRank(v) => Supplied::ThisRank(conv(v)),
            },
            pieces: None,
        }
    }
}

impl Binding {
    /// The whole logical tensor (see [`TensorArg::Global`]).
    pub fn global<T: Element>(data: &[T]) -> Binding {
        TensorArg::Global(data.to_vec()).into()
    }

    /// One buffer per rank (see [`TensorArg::PerRank`]).
    pub fn per_rank<T: Element>(data: &[Vec<T>]) -> Binding {
        TensorArg::PerRank(data.to_vec()).into()
    }

    /// This process's rank's buffer only (see [`TensorArg::ThisRank`]).
    pub fn this_rank<T: Element>(data: &[T]) -> Binding {
        TensorArg::ThisRank(data.to_vec()).into()
    }

    /// A 1-D logical tensor given as separately allocated pieces, concatenated in order
    /// (e.g. a model's parameter tensors). The CPU backend keeps the pieces separate and
    /// its fused collectives work on them in place, without a flat copy.
    pub fn pieces<T: Element>(pieces: &[Vec<T>]) -> Binding {
        let mut b: Binding = TensorArg::Global(pieces.concat()).into();
        b.pieces = Some(Ok(pieces.iter().map(Vec::len).collect()));
        b
    }

    /// This process's rank's buffer only, as separately allocated pieces (a model's
    /// gradient tensors; see [`Binding::pieces`] and [`TensorArg::ThisRank`]).
    pub fn this_rank_pieces<T: Element>(pieces: &[Vec<T>]) -> Binding {
        let mut b: Binding = TensorArg::ThisRank(pieces.concat()).into();
        b.pieces = Some(Ok(pieces.iter().map(Vec::len).collect()));
        b
    }

    /// Pieces per rank (`pieces[r]` is rank r's list); every rank's pieces must have the
    /// same lengths.
    pub fn per_rank_pieces<T: Element>(pieces: &[Vec<Vec<T>>]) -> Binding {
        let mut b: Binding = TensorArg::PerRank(pieces.iter().map(|p| p.concat()).collect()).into();
        let lens = |p: &Vec<Vec<T>>| p.iter().map(Vec::len).collect::<Vec<_>>();
        let first = pieces.first().map(lens).unwrap_or_default();
        b.pieces = Some(match pieces.iter().position(|p| lens(p) != first) {
            Some(r) => Err(r),
            None => Ok(first),
        });
        b
    }

    /// The whole logical tensor of dtype `dtype` from f64 values, each rounded to it (for
    /// callers that learn an input's dtype from the program).
    pub fn global_as(dtype: DType, data: &[f64]) -> Binding {
        Binding {
            dtype,
            data: Supplied::Global(host_data_as(dtype, data)),
            pieces: None,
        }
    }

    /// One buffer per rank (see [`TensorArg::PerRank`]) of dtype `dtype` from f64
    /// values, each rounded to it.
    pub fn per_rank_as(dtype: DType, data: &[Vec<f64>]) -> Binding {
        Binding {
            dtype,
            data: Supplied::PerRank(data.iter().map(|d| host_data_as(dtype, d)).collect()),
            pieces: None,
        }
    }

    /// The dtype of the bound data.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
}

/// `data` rounded to `dtype` and held in it.
fn host_data_as(dtype: DType, data: &[f64]) -> HostData {
    fn conv<T: Element>(data: &[f64]) -> HostData {
        HostData::from_vec(
            data.iter()
                .map(|&x| T::from_f64(T::DTYPE.round(x)))
                .collect::<Vec<T>>(),
        )
    }
    match dtype {
        DType::F16 => conv::<half::f16>(data),
        DType::BF16 => conv::<half::bf16>(data),
        DType::F32 => conv::<f32>(data),
        DType::F64 => conv::<f64>(data),
        DType::I32 => conv::<i32>(data),
        DType::I64 => conv::<i64>(data),
        DType::Bool => conv::<bool>(data),
    }
}

/// Everything a program needs at run time, by name.
///
/// ```
/// use coconet_core::{Binding, Bindings};
/// let b = Bindings::new()
///     .dim("N", 10)
///     .scalar("lr", 0.1f32)
///     .tensor("w", Binding::global(&[0.5f32; 10]));
/// assert_eq!(b.dims()["N"], 10);
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Bindings {
    pub(crate) dims: BTreeMap<String, usize>,
    pub(crate) scalars: BTreeMap<String, (DType, f64)>,
    pub(crate) tensors: BTreeMap<String, Binding>,
}

impl Bindings {
    /// No bindings.
    pub fn new() -> Bindings {
        Bindings::default()
    }

    /// Binds a symbolic dimension.
    pub fn dim(mut self, name: &str, size: usize) -> Bindings {
        self.dims.insert(name.to_string(), size);
        self
    }

    /// Binds a scalar input.
    pub fn scalar<T: Element>(mut self, name: &str, value: T) -> Bindings {
        self.scalars
            .insert(name.to_string(), (T::DTYPE, value.to_f64()));
        self
    }

    /// Binds a scalar input of dtype `dtype` to `value` rounded to it (as a cast in a
    /// program rounds), for callers that hold hyper-parameters as numbers and learn the
    /// input's dtype from the program.
    pub fn scalar_as(mut self, name: &str, dtype: DType, value: f64) -> Bindings {
        self.scalars
            .insert(name.to_string(), (dtype, dtype.round(value)));
        self
    }

    /// Binds a tensor input.
    pub fn tensor(mut self, name: &str, binding: impl Into<Binding>) -> Bindings {
        self.tensors.insert(name.to_string(), binding.into());
        self
    }

    /// The bound dims.
    pub fn dims(&self) -> &BTreeMap<String, usize> {
        &self.dims
    }

    /// The bound dims, to edit.
    pub fn dims_mut(&mut self) -> &mut BTreeMap<String, usize> {
        &mut self.dims
    }

    /// The bound tensors, to edit.
    pub fn tensors_mut(&mut self) -> &mut BTreeMap<String, Binding> {
        &mut self.tensors
    }
}
