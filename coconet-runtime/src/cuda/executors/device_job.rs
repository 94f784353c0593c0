//! Running a [`CudaProgram`] on a [`Device`] with virtual ranks: every rank's buffers
//! live on the one device, so peer pointers are plain device pointers, and each rank's
//! launches of a step are issued in rank order on one stream, so a launch sees what the
//! launches before it wrote and no flags are needed between ranks. An overlapped
//! matmul runs block by block; after each block every rank's fused all-reduce is
//! launched on the rows that block finished. The order of launches, matmuls and events
//! is [`exchange_plan`](crate::cuda::actions::exchanged)'s, shared with ranks that have separate
//! memories.

use crate::RuntimeError;
use crate::cuda::actions::Action;
use crate::cuda::actions::exchanged::{Pipelining, actions};
use crate::cuda::codegen::{Arg, CudaProgram, Launch, Mode, PtrArg};
use crate::cuda::devices::Device;
use crate::cuda::lent::{Lent, check_disjoint};
use crate::plan::{BufferRef, Plan};
use coconet_core::{Bindings, DType, ValueId};
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::ffi::c_void;

/// Threads per block of every launch.
pub const BLOCK: u32 = 256;

/// A plan bound to inputs on a device.
pub struct DeviceJob<D: Device> {
    plan: Plan,
    program: CudaProgram,
    buffers: HashMap<(usize, BufferRef), D::Buffer>,
    scratch: Vec<D::Buffer>,
    scalars: HashMap<ValueId, f64>,
    uniform: HashMap<ValueId, f64>,
    /// Blocks per launch (`None`: enough for every thread wanted, capped).
    grid: Option<u32>,
    arrays: PointerArrays<D::Buffer>,
    /// What a run does, in order (every rank's launches and matmuls).
    actions: Vec<Action>,
    /// The caller's memory standing for buffers during a lending run.
    lent: HashMap<(usize, BufferRef), u64>,
    /// Input buffers lent in place in the last run: the job's own copy is not the value
    /// the run used or wrote, so it is not read, and not run on where the program
    /// updates it, until it is written or lent again.
    stale: HashSet<(usize, BufferRef)>,
    /// Why the last run failed: the buffers may hold part of a step, so they are neither
    /// run nor read again.
    failed: Option<String>,
}

impl<D: Device> DeviceJob<D> {
    /// Binds inputs (checked exactly like the reference interpreter) and allocates every
    /// rank's buffers on `device`.
    pub fn new(
        device: &D,
        plan: &Plan,
        program: CudaProgram,
        bindings: &Bindings,
        grid: Option<u32>,
    ) -> Result<DeviceJob<D>, RuntimeError> {
        let bound = plan.bind(bindings)?;
        let mut buffers = HashMap::new();
        for (&id, per_rank) in &bound.tensors {
            for (r, data) in per_rank.iter().enumerate() {
                if let Some(d) = data {
                    let b = device.upload(d)?;
                    buffers.insert((r, BufferRef::Input(id)), b);
                }
            }
        }
        for (s, slot) in plan.slots().iter().enumerate() {
            for r in 0..plan.ranks() {
                let b = device.zeros(slot.dtype, slot.elements[r])?;
                buffers.insert((r, BufferRef::Slot(s)), b);
            }
        }
        let scratch = (0..plan.ranks())
            .map(|_| device.zeros(DType::F64, program.scratch))
            .collect::<Result<_, _>>()?;
        let (actions, _) = actions(plan, &program, None, Pipelining::OFF)?;
        Ok(DeviceJob {
            plan: plan.clone(),
            program,
            buffers,
            scratch,
            scalars: bound.scalars,
            uniform: HashMap::new(),
            grid,
            arrays: PointerArrays::new(),
            actions,
            lent: HashMap::new(),
            stale: HashSet::new(),
            failed: None,
        })
    }

    /// The device address of rank `rank`'s buffer `b`: the caller's lent memory during a
    /// lending run, else the job's own.
    fn base(&self, device: &D, rank: usize, b: BufferRef) -> Result<u64, RuntimeError> {
        if let Some(&at) = self.lent.get(&(rank, b)) {
            return Ok(at);
        }
        let buf = self.buffers.get(&(rank, b)).ok_or_else(|| {
            RuntimeError::Plan(format!(
                "rank {rank} has no buffer {b:?} (a value outside its group)"
            ))
        })?;
        Ok(device.address(buf))
    }

    fn address(&self, device: &D, p: &PtrArg) -> Result<u64, RuntimeError> {
        let size = crate::cuda::actions::buffer_size(&self.plan, p.buffer);
        Ok(self.base(device, p.rank, p.buffer)? + (p.offset * size) as u64)
    }

    /// An error once a run has failed (the buffers may hold part of a step).
    fn usable(&self) -> Result<(), RuntimeError> {
        match &self.failed {
            None => Ok(()),
            Some(e) => Err(RuntimeError::Plan(format!(
                "an earlier run failed ({e}); the job's buffers are undefined — prepare a new job"
            ))),
        }
    }

    /// Runs every step once and waits for it.
    pub fn run(&mut self, device: &D) -> Result<(), RuntimeError> {
        let done = self.run_lent(device, &Lent::new(), None)?;
        device.wait_host(&done)
    }

    /// Runs every step once with `lent` standing for the job's buffers, after `after`
    /// (and the lent slices' streams); returns the event the run's work ends at, without
    /// waiting for it.
    pub fn run_lent(
        &mut self,
        device: &D,
        lent: &Lent<'_>,
        after: Option<&D::Event>,
    ) -> Result<D::Event, RuntimeError> {
        self.usable()?;
        let (in_place, gathered) = self.check_lent(device, lent)?;
        let plan = &self.plan;
        let updated = |id: ValueId| plan.program().updates().any(|(t, _)| t == id);
        if let Some(&(r, b)) = self.stale.iter().find(|&&(r, b)| {
            !in_place.contains_key(&(r, b)) && matches!(b, BufferRef::Input(id) if updated(id))
        }) {
            let BufferRef::Input(id) = b else {
                unreachable!()
            };
            return Err(RuntimeError::Lend(format!(
                "`{}` on rank {r} was lent in the last run, which updated it in the lent \
                 memory: the job's own copy is stale. Lend it again, or write it first",
                plan.program().label(id)
            )));
        }
        if let Some(e) = after {
            device.wait_event(e)?;
        }
        device.after_lenders(lent)?;
        self.lent = in_place;
        let result = self.enqueue_lent(device, &gathered);
        let lent_now: Vec<(usize, BufferRef)> = self.lent.drain().map(|(k, _)| k).collect();
        if let Err(e) = result {
            self.failed = Some(e.to_string());
            return Err(e);
        }
        for key in lent_now {
            self.stale.insert(key);
        }
        let done = device.record()?;
        device.release_lenders(lent, &done)?;
        Ok(done)
    }

    /// Copies pieces in, runs the actions, copies updated pieces out.
    fn enqueue_lent(&mut self, device: &D, gathered: &[Gathered]) -> Result<(), RuntimeError> {
        for g in gathered {
            let own = self.base(device, g.rank, g.buffer)?;
            for &(at, offset, bytes) in &g.pieces {
                device.copy(own + offset, at, bytes)?;
            }
        }
        self.enqueue(device)?;
        for g in gathered.iter().filter(|g| g.updated) {
            let own = self.base(device, g.rank, g.buffer)?;
            for &(at, offset, bytes) in &g.pieces {
                device.copy(at, own + offset, bytes)?;
            }
        }
        Ok(())
    }

    /// Checks `lent` against the plan and the device: each input exists on the rank,
    /// every piece is of its dtype and memory, the pieces add up to the rank's buffer,
    /// nothing overlaps. Returns the buffers lent in place (one piece) and those to
    /// gather from pieces.
    #[allow(clippy::type_complexity)]
    fn check_lent(
        &self,
        device: &D,
        lent: &Lent<'_>,
    ) -> Result<(HashMap<(usize, BufferRef), u64>, Vec<Gathered>), RuntimeError> {
        check_disjoint(lent)?;
        let mut in_place = HashMap::new();
        let mut gathered = Vec::new();
        let mut seen = HashSet::new();
        for e in &lent.entries {
            let id = self.plan.tensor_input(&e.input)?;
            let key = (e.rank, BufferRef::Input(id));
            if !seen.insert(key) {
                return Err(RuntimeError::Lend(format!(
                    "`{}` on rank {} is lent twice",
                    e.input, e.rank
                )));
            }
            let pieces = check_pieces(device, &self.plan, e, id, self.buffers.contains_key(&key))?;
            match &pieces[..] {
                [(at, 0, _)] => {
                    in_place.insert(key, *at);
                }
                _ => gathered.push(Gathered {
                    rank: e.rank,
                    buffer: key.1,
                    pieces,
                    updated: self.plan.program().updates().any(|(t, _)| t == id),
                }),
            }
        }
        Ok((in_place, gathered))
    }

    /// Queues every step once.
    fn enqueue(&mut self, device: &D) -> Result<(), RuntimeError> {
        self.uniform.clear();
        for i in 0..self.actions.len() {
            match &self.actions[i] {
                Action::Uniform(vs) => {
                    let vs = vs.clone();
                    crate::plan::uniform_values(
                        self.plan.program(),
                        &vs,
                        &self.scalars,
                        &mut self.uniform,
                    );
                }
                Action::Launch { launch, lo, hi, .. } => {
                    self.launch(device, i, launch, *lo, *hi)?
                }
                a @ (Action::WaitKernels | Action::BlockDone) => a.order_streams(device)?,
                Action::Gemm(m, rows) => {
                    let (a, b, o) = (
                        self.address(device, &m.a)?,
                        self.address(device, &m.b)?,
                        self.address(device, &m.out)?,
                    );
                    device.gemm(m, a, b, o, rows.clone())?;
                }
                Action::Exchange { .. }
                | Action::TransfersWaitKernels
                | Action::KernelsWaitTransfers
                | Action::Barrier => {
                    return Err(RuntimeError::Plan(
                        "internal error: an exchange between virtual ranks".into(),
                    ));
                }
            }
        }
        Ok(())
    }

    fn launch(
        &self,
        device: &D,
        site: usize,
        l: &Launch,
        lo: usize,
        hi: usize,
    ) -> Result<(), RuntimeError> {
        let scratch = device.address(&self.scratch[l.rank]);
        launch_kernel(
            device,
            &self.plan,
            site,
            l,
            (lo, hi),
            self.grid,
            &self.uniform,
            scratch,
            &self.arrays,
            &mut |_, _, p| self.address(device, p),
        )
    }

    /// Rank `rank`'s data of `v` as f64 (`None` where the rank does not hold it).
    pub fn value(
        &self,
        device: &D,
        v: ValueId,
        rank: usize,
    ) -> Result<Option<Vec<f64>>, RuntimeError> {
        self.readable(v, rank)?;
        read_value(device, &self.plan, v, rank, &self.uniform, &|b| {
            self.buffers.get(&(rank, b))
        })
    }

    /// Copies rank `rank`'s data of `v` into `out` in its own dtype (`out` is exactly its
    /// size: checked by the caller); downloads that rank's data only. `Ok(false)` where
    /// the rank does not hold `v`.
    pub fn read_bytes(
        &self,
        device: &D,
        v: ValueId,
        rank: usize,
        out: &mut [u8],
    ) -> Result<bool, RuntimeError> {
        self.readable(v, rank)?;
        read_raw(device, &self.plan, v, rank, &self.uniform, out, &mut |b| {
            self.base(device, rank, b).ok()
        })
    }

    /// Copies rank `rank`'s data of `v` to device memory at `dst` (its size, checked by the
    /// caller), ordered with the kernels.
    pub fn copy_to(
        &self,
        device: &D,
        v: ValueId,
        rank: usize,
        dst: u64,
    ) -> Result<bool, RuntimeError> {
        self.readable(v, rank)?;
        copy_value(device, &self.plan, v, rank, dst, &mut |b| {
            self.base(device, rank, b).ok()
        })
    }

    /// Refuses reads after a failed run and of buffers lent in the last run.
    fn readable(&self, v: ValueId, rank: usize) -> Result<(), RuntimeError> {
        self.usable()?;
        let view = self.plan.view(v, rank);
        if let Some(b) = view.map(|w| w.buffer)
            && self.stale.contains(&(rank, b))
        {
            return Err(RuntimeError::Read(format!(
                "`{}` on rank {rank} lives in the memory lent for the last run; read it there",
                self.plan.program().label(v)
            )));
        }
        Ok(())
    }

    /// Overwrites rank `rank`'s buffer of tensor input `name` with `bytes` (its dtype and
    /// size) for the next run.
    pub fn write_input(
        &mut self,
        device: &D,
        name: &str,
        rank: usize,
        bytes: &[u8],
    ) -> Result<(), RuntimeError> {
        self.usable()?;
        let id = self.plan.tensor_input(name)?;
        let b = self
            .buffers
            .get(&(rank, BufferRef::Input(id)))
            .ok_or_else(|| RuntimeError::Read(format!("rank {rank} does not hold `{name}`")))?;
        write_checked(device, &self.plan, b, id, rank, bytes)?;
        self.stale.remove(&(rank, BufferRef::Input(id)));
        Ok(())
    }

    /// Sets scalar input `id` for the next runs.
    pub fn set_scalar(&mut self, id: ValueId, value: f64) {
        self.scalars.insert(id, value);
    }

    /// The plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The generated program.
    pub fn program(&self) -> &CudaProgram {
        &self.program
    }
}

/// Launches `l` over positions `lo..hi` on `device`; `ptr(arg, k, p)` gives the device
/// address of pointer `k` of argument `arg` (0 for a single pointer).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_kernel<D: Device>(
    device: &D,
    plan: &Plan,
    site: usize,
    l: &Launch,
    (lo, hi): (usize, usize),
    grid: Option<u32>,
    uniform: &HashMap<ValueId, f64>,
    scratch: u64,
    arrays: &PointerArrays<D::Buffer>,
    ptr: &mut dyn FnMut(usize, usize, &PtrArg) -> Result<u64, RuntimeError>,
) -> Result<(), RuntimeError> {
    let threads = l.threads(lo, hi);
    if threads == 0 {
        return Ok(());
    }
    // Argument storage: every value lives in `words` until the launch returns.
    let mut words: Vec<u64> = Vec::new();
    for (a, arg) in l.args.iter().enumerate() {
        match arg {
            Arg::Range => words.extend([lo as u64, hi as u64]),
            Arg::Ptr(p, _) => words.push(ptr(a, 0, p)?),
            Arg::Reads(ps) | Arg::Writes(ps) => {
                let addrs = ps
                    .iter()
                    .enumerate()
                    .map(|(k, p)| ptr(a, k, p))
                    .collect::<Result<Vec<_>, _>>()?;
                words.push(arrays.address(device, (site, a), addrs)?);
            }
            Arg::I64(x) => words.push(*x as u64),
            Arg::Uniform(v) => {
                let x = uniform.get(v).copied().ok_or_else(|| {
                    RuntimeError::Plan(format!(
                        "scalar `{}` is used before it is computed",
                        plan.program().label(*v)
                    ))
                })?;
                words.push(x.to_bits());
            }
            Arg::Scratch { offset, .. } => words.push(scratch + 8 * *offset as u64),
        }
    }
    let mut ptrs: Vec<*mut c_void> = words.iter_mut().map(|w| (w as *mut u64).cast()).collect();
    let block = match l.mode {
        Mode::Threads(t) => t as u32,
        Mode::Blocks => coconet_core::numerics::REDUCE_LANES as u32,
        Mode::Rows(_) => coconet_core::numerics::ROW_LANES as u32,
        _ => BLOCK.min(threads as u32).max(1),
    };
    let grid = match l.mode {
        Mode::Threads(_) => 1,
        _ => grid.unwrap_or_else(|| threads.div_ceil(block as usize).clamp(1, 65_535) as u32),
    };
    device.launch(l.kernel, grid, block, &mut ptrs)
}

/// The device arrays of peer pointers a job's launches pass: one per launch site (an
/// action and its argument), kept for the job's life and rewritten, ordered with the
/// kernels, only when its content changes (memory lent to a run moves an address).
/// Launches neither allocate nor wait for the device to free, and the number of arrays
/// is bounded by the plan, however many different addresses are lent.
pub(crate) struct PointerArrays<B>(RefCell<HashMap<Site, (Vec<u64>, B)>>);

/// A launch site: an action of a run and one of its arguments.
type Site = (usize, usize);

impl<B> PointerArrays<B> {
    pub(crate) fn new() -> Self {
        PointerArrays(RefCell::new(HashMap::new()))
    }

    /// The device address of launch site `site`'s array, holding `addrs`.
    fn address<D: Device<Buffer = B>>(
        &self,
        device: &D,
        site: Site,
        addrs: Vec<u64>,
    ) -> Result<u64, RuntimeError> {
        let mut arrays = self.0.borrow_mut();
        if let Some((held, b)) = arrays.get_mut(&site) {
            if *held != addrs {
                let bytes: Vec<u8> = addrs.iter().flat_map(|a| a.to_ne_bytes()).collect();
                // The same length: a site's array always has one pointer per peer.
                device.write(b, &bytes)?;
                *held = addrs;
            }
            return Ok(device.address(b));
        }
        let b = device.addresses(&addrs)?;
        let at = device.address(&b);
        arrays.insert(site, (addrs, b));
        Ok(at)
    }
}

/// An input lent as several pieces: `(lent address, offset in the job's buffer, bytes)`
/// per piece, gathered into the buffer before the run and, if the program updates the
/// input, scattered back after it.
pub(crate) struct Gathered {
    pub(crate) rank: usize,
    pub(crate) buffer: BufferRef,
    pub(crate) pieces: Vec<(u64, u64, usize)>,
    pub(crate) updated: bool,
}

/// Checks one lent entry (input `id`, held on the rank here where `held`): dtype,
/// memory and extent of every piece, and their total against the rank's buffer.
/// Returns `(address, offset, bytes)` per piece.
pub(crate) fn check_pieces<D: Device>(
    device: &D,
    plan: &Plan,
    e: &crate::cuda::lent::LentInput<'_>,
    id: ValueId,
    held: bool,
) -> Result<Vec<(u64, u64, usize)>, RuntimeError> {
    let name = &e.input;
    let rank = e.rank;
    if !held {
        return Err(RuntimeError::Lend(if rank >= plan.ranks() {
            format!(
                "rank {rank} does not exist (the job has {} ranks)",
                plan.ranks()
            )
        } else {
            format!("rank {rank} does not hold `{name}` here")
        }));
    }
    let (dtype, n) = plan.buffer_extent(BufferRef::Input(id), rank);
    let mut offset = 0u64;
    let mut total = 0usize;
    let mut out = Vec::with_capacity(e.pieces.len());
    for (k, piece) in e.pieces.iter().enumerate() {
        let which = if e.pieces.len() == 1 {
            format!("`{name}` on rank {rank}")
        } else {
            format!("piece {k} of `{name}` on rank {rank}")
        };
        if piece.dtype != dtype {
            return Err(RuntimeError::Lend(format!(
                "{which} is {:?} memory; `{name}` holds {dtype:?}",
                piece.dtype
            )));
        }
        if piece.memory != device.memory() {
            return Err(RuntimeError::Lend(format!(
                "{which} is in {}; the job runs on {}",
                piece.memory,
                device.memory()
            )));
        }
        device
            .check_lent(piece.address, piece.bytes())
            .map_err(|why| RuntimeError::Lend(format!("{which}: {why}")))?;
        total += piece.len;
        out.push((piece.address, offset, piece.bytes()));
        offset += piece.bytes() as u64;
    }
    if total != n {
        return Err(RuntimeError::Lend(format!(
            "`{name}` on rank {rank} holds {n} elements ({:?}); {total} lent",
            plan.local_shape(id, rank)
        )));
    }
    Ok(out)
}

/// Rank `r`'s data of `v` as f64 (`None` where `r` does not hold it); `buffer` finds
/// rank `r`'s buffers.
pub(crate) fn read_value<'a, D: Device>(
    device: &D,
    plan: &Plan,
    v: ValueId,
    r: usize,
    uniform: &HashMap<ValueId, f64>,
    buffer: &dyn Fn(BufferRef) -> Option<&'a D::Buffer>,
) -> Result<Option<Vec<f64>>, RuntimeError>
where
    D::Buffer: 'a,
{
    let p = plan.program();
    if !plan.holders(v).contains(&r) {
        return Ok(None);
    }
    if let Some(x) = uniform.get(&v) {
        return Ok(Some(vec![*x]));
    }
    let view = plan
        .view(v, r)
        .ok_or_else(|| RuntimeError::Read(format!("`{}` is not kept in memory", p.label(v))))?;
    let b = buffer(view.buffer).ok_or_else(|| {
        RuntimeError::Read(format!("rank {r} has no buffer for `{}`", p.label(v)))
    })?;
    let (dtype, len) = plan.buffer_extent(view.buffer, r);
    Ok(Some(view.gather(&device.download(b, dtype, len)?)))
}

/// Writes `bytes` into input `id`'s buffer `b` on rank `rank` if they are its size.
pub(crate) fn write_checked<D: Device>(
    device: &D,
    plan: &Plan,
    b: &D::Buffer,
    id: ValueId,
    rank: usize,
    bytes: &[u8],
) -> Result<(), RuntimeError> {
    let (dtype, n) = plan.buffer_extent(BufferRef::Input(id), rank);
    if bytes.len() != n * dtype.size_bytes() {
        return Err(RuntimeError::Read(format!(
            "`{}` on rank {rank} holds {} bytes; {} given",
            plan.program().label(id),
            n * dtype.size_bytes(),
            bytes.len()
        )));
    }
    device.write(b, bytes)
}

/// Copies rank `r`'s data of `v` into `out` (exactly its bytes), run by run from its
/// buffer; `base` finds the rank's buffers' addresses. `Ok(false)` where `r` does not
/// hold `v`.
pub(crate) fn read_raw<D: Device>(
    device: &D,
    plan: &Plan,
    v: ValueId,
    r: usize,
    uniform: &HashMap<ValueId, f64>,
    out: &mut [u8],
    base: &mut dyn FnMut(BufferRef) -> Option<u64>,
) -> Result<bool, RuntimeError> {
    let p = plan.program();
    if !plan.holders(v).contains(&r) {
        return Ok(false);
    }
    if let Some(x) = uniform.get(&v) {
        let mut one = crate::host::memory::Buffer::from_f64(p.node(v).ty.dtype, &[*x]);
        let raw = one.raw();
        // SAFETY: a buffer of this function's own, one element long.
        out.copy_from_slice(unsafe { raw.bytes(0, 1) });
        return Ok(true);
    }
    let view = plan
        .view(v, r)
        .ok_or_else(|| RuntimeError::Read(format!("`{}` is not kept in memory", p.label(v))))?;
    let at = base(view.buffer).ok_or_else(|| {
        RuntimeError::Read(format!("rank {r} has no buffer for `{}`", p.label(v)))
    })?;
    let size = crate::cuda::actions::buffer_size(plan, view.buffer);
    let mut done = 0;
    for (start, len) in view.runs() {
        let bytes = len * size;
        device.read_bytes(at + (start * size) as u64, &mut out[done..done + bytes])?;
        done += bytes;
    }
    Ok(true)
}

/// Copies rank `r`'s data of `v` to device address `dst`, run by run, ordered with the
/// kernels. `Ok(false)` where `r` does not hold `v`.
pub(crate) fn copy_value<D: Device>(
    device: &D,
    plan: &Plan,
    v: ValueId,
    r: usize,
    dst: u64,
    base: &mut dyn FnMut(BufferRef) -> Option<u64>,
) -> Result<bool, RuntimeError> {
    let p = plan.program();
    if !plan.holders(v).contains(&r) {
        return Ok(false);
    }
    let view = plan.view(v, r).ok_or_else(|| {
        RuntimeError::Read(format!(
            "`{}` is not kept in device memory (a scalar: read it to the host)",
            p.label(v)
        ))
    })?;
    let at = base(view.buffer).ok_or_else(|| {
        RuntimeError::Read(format!("rank {r} has no buffer for `{}`", p.label(v)))
    })?;
    let size = crate::cuda::actions::buffer_size(plan, view.buffer);
    let mut done = 0u64;
    for (start, len) in view.runs() {
        device.copy(dst + done, at + (start * size) as u64, len * size)?;
        done += (len * size) as u64;
    }
    Ok(true)
}
