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
use crate::plan::{BufferRef, Plan};
use coconet_core::{Bindings, DType, ValueId};
use std::cell::RefCell;
use std::collections::HashMap;
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
        })
    }

    fn address(&self, device: &D, p: &PtrArg) -> Result<u64, RuntimeError> {
        let b = self.buffers.get(&(p.rank, p.buffer)).ok_or_else(|| {
            RuntimeError::Plan(format!(
                "rank {} has no buffer {:?} (a value outside its group)",
                p.rank, p.buffer
            ))
        })?;
        let size = match p.buffer {
            BufferRef::Input(v) => self.plan.program().node(v).ty.dtype.size_bytes(),
            BufferRef::Slot(s) => self.plan.slots()[s].dtype.size_bytes(),
        };
        Ok(device.address(b) + (p.offset * size) as u64)
    }

    /// Runs every step once.
    pub fn run(&mut self, device: &D) -> Result<(), RuntimeError> {
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
                Action::Launch { launch, lo, hi, .. } => self.launch(device, launch, *lo, *hi)?,
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
        device.synchronize()
    }

    fn launch(&self, device: &D, l: &Launch, lo: usize, hi: usize) -> Result<(), RuntimeError> {
        let scratch = device.address(&self.scratch[l.rank]);
        launch_kernel(
            device,
            &self.plan,
            l,
            (lo, hi),
            self.grid,
            &self.uniform,
            scratch,
            &self.arrays,
            &mut |_, _, p| self.address(device, p),
        )
    }

    /// Every rank's data of `v` (empty for ranks without it), as f64.
    pub fn values(&self, device: &D, v: ValueId) -> Result<Vec<Vec<f64>>, RuntimeError> {
        (0..self.plan.ranks())
            .map(|r| {
                let value = read_value(device, &self.plan, v, r, &self.uniform, &|b| {
                    self.buffers.get(&(r, b))
                })?;
                Ok(value.unwrap_or_default())
            })
            .collect()
    }

    /// Every rank's data of tensor input `name` after the run (updates included).
    pub fn input_values(&self, device: &D, name: &str) -> Result<Vec<Vec<f64>>, RuntimeError> {
        let id = self.plan.tensor_input(name)?;
        (0..self.plan.ranks())
            .map(|r| match self.buffers.get(&(r, BufferRef::Input(id))) {
                Some(b) => {
                    let (dtype, n) = self.plan.buffer_extent(BufferRef::Input(id), r);
                    device.download(b, dtype, n)
                }
                None => Ok(vec![]),
            })
            .collect()
    }

    /// Overwrites rank `rank`'s buffer of tensor input `name` with `bytes` (its dtype and
    /// size) for the next run.
    pub fn write_input(
        &self,
        device: &D,
        name: &str,
        rank: usize,
        bytes: &[u8],
    ) -> Result<(), RuntimeError> {
        let id = self.plan.tensor_input(name)?;
        let b = self
            .buffers
            .get(&(rank, BufferRef::Input(id)))
            .ok_or_else(|| RuntimeError::Read(format!("rank {rank} does not hold `{name}`")))?;
        write_checked(device, &self.plan, b, id, rank, bytes)
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
                words.push(arrays.address(device, addrs)?);
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

/// The device arrays of peer pointers a job's launches pass, made once per distinct
/// content and kept for the job's life: launches neither allocate nor wait for the
/// device to free them.
pub(crate) struct PointerArrays<B>(RefCell<HashMap<Vec<u64>, B>>);

impl<B> PointerArrays<B> {
    pub(crate) fn new() -> Self {
        PointerArrays(RefCell::new(HashMap::new()))
    }

    /// The device address of an array holding `addrs`.
    fn address<D: Device<Buffer = B>>(
        &self,
        device: &D,
        addrs: Vec<u64>,
    ) -> Result<u64, RuntimeError> {
        if let Some(b) = self.0.borrow().get(&addrs) {
            return Ok(device.address(b));
        }
        let b = device.addresses(&addrs)?;
        let at = device.address(&b);
        self.0.borrow_mut().insert(addrs, b);
        Ok(at)
    }
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
