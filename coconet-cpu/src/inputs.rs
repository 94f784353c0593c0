//! A job's inputs on the ranks this process runs: tensor buffers and scalar values,
//! written and read between runs without copies or conversions.
//!
//! Rank threads ([`Job`](super::Job)) hold every rank's buffers; an MPI process holds its
//! own rank's only. Both hand out the same borrowed views, checked the same way.

use coconet_core::{BoundInputs, DType, Element, InterpError, Layout, ValueId, block_range};
use coconet_plan::RuntimeError;
use coconet_plan::host::memory::{Buffer, Raw, Seg};
use coconet_plan::plan::Plan;
use std::collections::HashMap;

/// Tensor buffers per rank (empty maps for ranks in other processes) and scalars.
#[derive(Debug)]
pub(crate) struct Inputs {
    pub(crate) buffers: Vec<HashMap<ValueId, Buffer>>,
    pub(crate) scalars: HashMap<ValueId, f64>,
}

impl Inputs {
    /// Allocates the buffers of the ranks `bound` lays out (the others stay empty).
    pub(crate) fn allocate(plan: &Plan, bound: BoundInputs<'_>) -> Result<Inputs, RuntimeError> {
        let p = plan.program();
        let mut buffers: Vec<HashMap<ValueId, Buffer>> =
            (0..plan.ranks()).map(|_| HashMap::new()).collect();
        for (&id, per_rank) in &bound.tensors {
            let node = p.node(id);
            // Pieces stay separate where every rank holds the whole tensor.
            let pieces = bound
                .pieces
                .get(&id)
                .filter(|_| matches!(node.ty.layout, Layout::Replicated | Layout::Local));
            for (r, data) in per_rank.iter().enumerate() {
                let Some(d) = data else {
                    // Another process's rank, or a rank outside the input's group: an
                    // empty buffer where the rank is here (the plan never reads it).
                    if plan.holders(id).contains(&r) {
                        continue;
                    }
                    buffers[r].insert(id, Buffer::zeros(node.ty.dtype, 0));
                    continue;
                };
                let buffer = match pieces {
                    Some(lens) => Buffer::pieces(d, lens),
                    None => Buffer::try_from_host(d),
                };
                let what = || format!("input `{}` on rank {r}", p.label(id));
                buffers[r].insert(id, allocated(buffer, what, d.len(), node.ty.dtype)?);
            }
        }
        Ok(Inputs {
            buffers,
            scalars: bound.scalars,
        })
    }

    /// Copies `bytes` (elements of the input's dtype, checked by the caller) into rank
    /// `rank`'s buffer of input `name`, piece after piece.
    pub(crate) fn write_bytes(
        &mut self,
        plan: &Plan,
        name: &str,
        rank: usize,
        bytes: &[u8],
    ) -> Result<(), RuntimeError> {
        let id = plan.tensor_input(name)?;
        let buffer = self
            .buffers
            .get_mut(rank)
            .and_then(|b| b.get_mut(&id))
            .ok_or_else(|| {
                RuntimeError::Read(format!("rank {rank} does not hold `{name}` here"))
            })?;
        let size = buffer.dtype.size_bytes();
        if bytes.len() != buffer.len * size {
            return Err(RuntimeError::Read(format!(
                "`{name}` on rank {rank} holds {} bytes; {} given",
                buffer.len * size,
                bytes.len()
            )));
        }
        buffer.write_bytes(bytes);
        Ok(())
    }

    /// Rank `rank`'s buffer of tensor input `name`, its dtype checked against `T`.
    pub(crate) fn buffer<T: Element>(
        &self,
        plan: &Plan,
        name: &str,
        rank: usize,
    ) -> Result<&Buffer, RuntimeError> {
        let id = plan.tensor_input(name)?;
        if rank >= plan.ranks() {
            return Err(RuntimeError::Read(format!(
                "rank {rank} does not exist (the job has {} ranks)",
                plan.ranks()
            )));
        }
        let buffer = self.buffers[rank].get(&id).ok_or_else(|| {
            let why = if plan.holders(id).contains(&rank) {
                "its data is in another process"
            } else {
                "it is outside the input's group"
            };
            RuntimeError::Read(format!("rank {rank} does not hold `{name}` here: {why}"))
        })?;
        check_dtype::<T>(name, buffer.dtype)?;
        Ok(buffer)
    }

    /// Rank `rank`'s buffer of input `name`, to write.
    pub(crate) fn buffer_mut<T: Element>(
        &mut self,
        plan: &Plan,
        name: &str,
        rank: usize,
    ) -> Result<&mut Buffer, RuntimeError> {
        self.buffer::<T>(plan, name, rank)?;
        let id = plan.tensor_input(name)?;
        Ok(self.buffers[rank]
            .get_mut(&id)
            .expect("checked by `buffer`"))
    }

    /// The whole buffer as one slice (refused for pieced buffers).
    pub(crate) fn view<T: Element>(
        &self,
        plan: &Plan,
        name: &str,
        rank: usize,
    ) -> Result<&[T], RuntimeError> {
        let buffer = self.buffer::<T>(plan, name, rank)?;
        whole(name, buffer.piece_count())?;
        Ok(buffer.piece(0).expect("dtype checked"))
    }

    /// The whole buffer as one mutable slice.
    pub(crate) fn view_mut<T: Element>(
        &mut self,
        plan: &Plan,
        name: &str,
        rank: usize,
    ) -> Result<&mut [T], RuntimeError> {
        let buffer = self.buffer_mut::<T>(plan, name, rank)?;
        whole(name, buffer.piece_count())?;
        Ok(buffer.piece_mut(0).expect("dtype checked"))
    }

    /// One piece of a pieced buffer (a plain buffer is one piece).
    pub(crate) fn piece<T: Element>(
        &self,
        plan: &Plan,
        name: &str,
        rank: usize,
        piece: usize,
    ) -> Result<&[T], RuntimeError> {
        let buffer = self.buffer::<T>(plan, name, rank)?;
        let count = buffer.piece_count();
        buffer
            .piece(piece)
            .ok_or_else(|| no_piece(name, piece, count))
    }

    /// One piece, to write.
    pub(crate) fn piece_mut<T: Element>(
        &mut self,
        plan: &Plan,
        name: &str,
        rank: usize,
        piece: usize,
    ) -> Result<&mut [T], RuntimeError> {
        let buffer = self.buffer_mut::<T>(plan, name, rank)?;
        let count = buffer.piece_count();
        buffer
            .piece_mut(piece)
            .ok_or_else(|| no_piece(name, piece, count))
    }

    /// Writes the whole logical tensor `data` into input `name` on every rank held here
    /// that holds it: a copy for Replicated and Local inputs, the rank's block for
    /// Sliced ones (as [`Binding::global`](coconet_core::Binding::global) lays it out).
    pub(crate) fn write_global<T: Element>(
        &mut self,
        plan: &Plan,
        name: &str,
        data: &[T],
    ) -> Result<(), RuntimeError> {
        let id = plan.tensor_input(name)?;
        let shape = plan.shape(id).to_vec();
        let len: usize = shape.iter().product();
        if data.len() != len {
            return Err(InterpError::Length {
                name: name.to_string(),
                rank: String::new(),
                shape: format!("{shape:?}"),
                expected: len,
                got: data.len(),
            }
            .into());
        }
        let layout = plan.program().node(id).ty.layout;
        let q = plan.group_size();
        let here: Vec<usize> = plan
            .holders(id)
            .filter(|&r| self.buffers[r].contains_key(&id))
            .collect();
        for r in here {
            let buffer = self.buffer_mut::<T>(plan, name, r)?;
            match layout {
                Layout::Replicated | Layout::Local => {
                    let mut at = 0;
                    for i in 0..buffer.piece_count() {
                        let piece = buffer.piece_mut::<T>(i).expect("dtype checked");
                        piece.copy_from_slice(&data[at..at + piece.len()]);
                        at += piece.len();
                    }
                }
                Layout::Sliced(d) => {
                    let block = block_range(shape[d], q, r % q);
                    let inner: usize = shape[d + 1..].iter().product();
                    let dst = buffer
                        .piece_mut::<T>(0)
                        .expect("Sliced inputs are one piece");
                    let run = block.len() * inner;
                    for (o, chunk) in dst.chunks_mut(run.max(1)).enumerate() {
                        let from = o * shape[d] * inner + block.start * inner;
                        chunk.copy_from_slice(&data[from..from + chunk.len()]);
                    }
                }
            }
        }
        Ok(())
    }
}

/// The caller's slices standing in for a rank's buffer of an input during one run: the
/// view, and the piece table it points into (kept alive with it).
pub(crate) struct Lent {
    pub raw: Raw,
    _table: Vec<Seg>,
}

/// A raw view of the caller's `pieces` (their concatenation) standing in for rank
/// `rank`'s buffer of input `name` during one run: checked to be an input the program
/// never writes, of the buffer's dtype and length.
pub(crate) fn lend<T: Element>(
    plan: &Plan,
    inputs: &Inputs,
    name: &str,
    rank: usize,
    pieces: &[&[T]],
) -> Result<Lent, RuntimeError> {
    let id = plan.tensor_input(name)?;
    if plan.program().updates().any(|(t, _)| t == id) {
        return Err(RuntimeError::Read(format!(
            "`{name}` is updated by the program: it cannot be read from borrowed slices; \
             write it with input_mut instead"
        )));
    }
    let own = inputs.buffer::<T>(plan, name, rank)?;
    let len: usize = pieces.iter().map(|p| p.len()).sum();
    if len != own.len {
        return Err(InterpError::Length {
            name: name.to_string(),
            rank: format!(" on rank {rank}"),
            shape: format!("{:?}", plan.local_shape(id, rank)),
            expected: own.len,
            got: len,
        }
        .into());
    }
    // Read-only use: the program never writes `name` (checked above).
    if let [one] = pieces {
        return Ok(Lent {
            // SAFETY: `Lent` borrows the piece for as long as the view lives; the
            // program only reads it.
            raw: unsafe { Raw::from_addr(one.as_ptr().cast_mut().cast(), len, T::DTYPE) },
            _table: Vec::new(),
        });
    }
    let mut start = 0;
    let table: Vec<Seg> = pieces
        .iter()
        .map(|p| {
            let seg = Seg::new(p.as_ptr().cast_mut().cast(), start, p.len());
            start += p.len();
            seg
        })
        .collect();
    Ok(Lent {
        // SAFETY: `Lent` owns the table (moved below: its heap storage does not move) and
        // borrows the pieces for as long as the view lives.
        raw: unsafe { Raw::from_segs(&table, len, T::DTYPE) },
        _table: table,
    })
}

/// The buffer, or an out-of-memory error naming it and its size.
pub(crate) fn allocated(
    buffer: Option<Buffer>,
    what: impl Fn() -> String,
    elements: usize,
    dtype: DType,
) -> Result<Buffer, RuntimeError> {
    buffer.ok_or_else(|| {
        InterpError::OutOfMemory {
            what: what(),
            bytes: elements.saturating_mul(dtype.size_bytes()),
        }
        .into()
    })
}

/// A borrowed view must be of the tensor's own dtype.
fn check_dtype<T: Element>(name: &str, dtype: DType) -> Result<(), RuntimeError> {
    if T::DTYPE == dtype {
        Ok(())
    } else {
        Err(RuntimeError::Read(format!(
            "`{name}` holds {dtype:?} elements, not {:?}",
            T::DTYPE
        )))
    }
}

fn whole(name: &str, pieces: usize) -> Result<(), RuntimeError> {
    if pieces == 1 {
        Ok(())
    } else {
        Err(RuntimeError::Read(format!(
            "`{name}` is bound as {pieces} separate pieces: read and write it piece by piece"
        )))
    }
}

fn no_piece(name: &str, piece: usize, count: usize) -> RuntimeError {
    RuntimeError::Read(format!(
        "`{name}` has {count} piece(s); there is no piece {piece}"
    ))
}
