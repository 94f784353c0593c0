//! The interface a backend implements to execute plans, and the one way every backend's
//! job is fed and read between runs.
//!
//! # Design
//! A backend turns a backend-neutral [`Plan`] into a prepared job (buffers allocated and
//! inputs bound on each rank's device, every binding checked before any rank starts),
//! then runs it. The CPU backend's ranks are threads sharing memory; a CUDA backend's are
//! devices (or virtual ranks on one device) with streams and events, whose fused
//! collectives use peer memory the way the CPU backend uses shared memory. Every job
//! answers the same questions through [`JobData`], so a training loop, the backend suite
//! and users need no adapter per backend.

use crate::RuntimeError;
use crate::plan::Plan;
use coconet_core::{Bindings, DType, Element, InterpError, Layout, Op, ValueId, block_range};

/// Executes plans.
pub trait Backend {
    /// A plan bound to inputs on this backend.
    type Job: JobData;

    /// Binds inputs and allocates buffers; fails (with nothing changed) on bad bindings.
    fn prepare(&self, plan: &Plan, bindings: &Bindings) -> Result<Self::Job, RuntimeError>;

    /// Runs the job once (updating its inputs in place, as a training step does).
    fn run(&self, job: &mut Self::Job) -> Result<(), RuntimeError>;
}

/// A prepared job's data between runs: new inputs and scalars for the next run, values
/// and updated inputs after the last one. A job in one process holds every rank's data;
/// a job of a multi-process backend holds its own rank's, and answers `None` (reads) or
/// an error (writes) for the others.
///
/// Reads convert only where no value changes: to the value's own dtype, or to f64 (which
/// holds every value of every dtype exactly, i64 up to 2^53). Handles of the unscheduled
/// program resolve to the scheduled program's value of the same name
/// ([`Plan::resolve`]); values that were not kept in memory are refused
/// ([`Plan::unreadable`]), never read as another value's data.
pub trait JobData {
    /// The plan the job runs.
    fn plan(&self) -> &Plan;

    /// Rank `rank`'s data of scheduled value `v` (kept in memory: checked by the
    /// caller) after the last run, as f64; `None` where the rank does not hold it here.
    fn rank_value(&self, v: ValueId, rank: usize) -> Result<Option<Vec<f64>>, RuntimeError>;

    /// Copies `bytes` (elements of the input's dtype) into rank `rank`'s buffer of tensor
    /// input `name`, for the next run.
    fn write_rank_bytes(
        &mut self,
        name: &str,
        rank: usize,
        bytes: &[u8],
    ) -> Result<(), RuntimeError>;

    /// Sets scalar input `id` (checked: a scalar input) to `value` for the next runs.
    fn set_scalar_value(&mut self, id: ValueId, value: f64) -> Result<(), RuntimeError>;

    /// Rank `rank`'s data of `v` after the last run, as `T`, or why it cannot be read:
    /// `Ok(None)` where the rank does not hold `v` (here).
    fn try_local<T: Element>(
        &self,
        v: impl Into<ValueId>,
        rank: usize,
    ) -> Result<Option<Vec<T>>, RuntimeError> {
        let plan = self.plan();
        let v = plan.resolve(v.into())?;
        let p = plan.program();
        check_read::<T>(&p.label(v), p.node(v).ty.dtype)?;
        if !plan.holders(v).contains(&rank) {
            return Ok(None);
        }
        if let Some(why) = plan.unreadable(v) {
            return Err(RuntimeError::Read(why));
        }
        Ok(self
            .rank_value(v, rank)?
            .map(|d| d.into_iter().map(T::from_f64).collect()))
    }

    /// [`JobData::try_local`], `None` for every reason it gives none.
    fn local<T: Element>(&self, v: impl Into<ValueId>, rank: usize) -> Option<Vec<T>> {
        self.try_local(v, rank).ok().flatten()
    }

    /// The logical value of a Replicated or Sliced value after the last run (every rank
    /// it needs must be in this process).
    fn logical<T: Element>(&self, v: impl Into<ValueId>) -> Result<Vec<T>, RuntimeError> {
        let plan = self.plan();
        let v = plan.resolve(v.into())?;
        let p = plan.program();
        let holders = plan.holders(v);
        let data = |r: usize| {
            self.try_local::<f64>(v, r)?.ok_or_else(|| {
                RuntimeError::Read(format!(
                    "rank {r}'s data of `{}` is not in this process",
                    p.label(v)
                ))
            })
        };
        check_read::<T>(&p.label(v), p.node(v).ty.dtype)?;
        let out = match p.node(v).ty.layout {
            Layout::Replicated => data(holders.start)?,
            Layout::Local => {
                return Err(RuntimeError::Read(format!(
                    "`{}` is Local (a different value per rank); read it per rank",
                    p.label(v)
                )));
            }
            Layout::Sliced(d) => {
                let q = holders.len();
                let full = plan.shape(v);
                let blocks = holders
                    .map(|r| Ok((data(r)?, block_range(full[d], q, r % q).len())))
                    .collect::<Result<Vec<_>, RuntimeError>>()?;
                let refs: Vec<(&[f64], usize)> = blocks.iter().map(|(b, n)| (&b[..], *n)).collect();
                coconet_core::numerics::tensor::concat_dim(&refs, full, d)
            }
        };
        Ok(out.into_iter().map(T::from_f64).collect())
    }

    /// The logical value of tensor input `name` after the last run.
    fn final_input<T: Element>(&self, name: &str) -> Result<Vec<T>, RuntimeError> {
        let id = self.plan().tensor_input(name)?;
        self.logical(id)
    }

    /// Rank `rank`'s buffer of tensor input `name` after the last run.
    fn final_input_local<T: Element>(
        &self,
        name: &str,
        rank: usize,
    ) -> Result<Vec<T>, RuntimeError> {
        let id = self.plan().tensor_input(name)?;
        self.try_local(id, rank)?
            .ok_or_else(|| RuntimeError::Read(format!("rank {rank} does not hold `{name}` here")))
    }

    /// Writes rank `rank`'s data of tensor input `name` for the next run (this
    /// iteration's gradient): `T` must be its dtype and `data` its length on that rank.
    fn write_input_local<T: Element>(
        &mut self,
        name: &str,
        rank: usize,
        data: &[T],
    ) -> Result<(), RuntimeError> {
        let plan = self.plan();
        let id = plan.tensor_input(name)?;
        let dtype = plan.program().node(id).ty.dtype;
        if T::DTYPE != dtype {
            return Err(InterpError::DType {
                name: name.to_string(),
                expected: dtype,
                got: T::DTYPE,
            }
            .into());
        }
        if !plan.holders(id).contains(&rank) {
            return Err(RuntimeError::Read(format!(
                "rank {rank} does not hold `{name}`"
            )));
        }
        let expected: usize = plan.local_shape(id, rank).iter().product();
        if data.len() != expected {
            return Err(InterpError::Length {
                name: name.to_string(),
                rank: format!(" on rank {rank}"),
                shape: format!("{:?}", plan.local_shape(id, rank)),
                expected,
                got: data.len(),
            }
            .into());
        }
        // SAFETY: every element type is plain data; the bytes are exactly `data`'s.
        let bytes = unsafe {
            std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data))
        };
        self.write_rank_bytes(name, rank, bytes)
    }

    /// Sets scalar input `name` for the next runs (a step counter, a learning rate, a
    /// seed); `T` must be its declared dtype.
    fn set_scalar<T: Element>(&mut self, name: &str, value: T) -> Result<(), RuntimeError> {
        let p = self.plan().program();
        let id = p
            .find(name)
            .filter(|&id| p.node(id).op == Op::ScalarInput)
            .ok_or_else(|| RuntimeError::Read(format!("`{name}` is not a scalar input")))?;
        let expected = p.node(id).ty.dtype;
        if T::DTYPE != expected {
            return Err(InterpError::DType {
                name: name.to_string(),
                expected,
                got: T::DTYPE,
            }
            .into());
        }
        self.set_scalar_value(id, value.to_f64())
    }
}

/// A copied read converts only where no value changes: to the tensor's own dtype, or to
/// f64 (which holds every value of every dtype exactly, i64 up to 2^53).
pub fn check_read<T: Element>(name: &str, dtype: DType) -> Result<(), RuntimeError> {
    if T::DTYPE == DType::F64 || T::DTYPE == dtype {
        Ok(())
    } else {
        Err(RuntimeError::Read(format!(
            "`{name}` holds {dtype:?} elements, not {:?}",
            T::DTYPE
        )))
    }
}
