//! Running a [`CudaProgram`] on a [`Device`] with virtual ranks: every rank's buffers
//! live on the one device, so peer pointers are plain device pointers, and each rank's
//! launches of a step are issued in rank order on one stream — the step's kernels read
//! only what earlier steps wrote, so no flags are needed between ranks. An overlapped
//! matmul runs block by block; after each block every rank's fused all-reduce is
//! launched on the rows that block finished.

use super::codegen::{Arg, CudaProgram, GpuStep, Launch, Mode, PtrArg, SCRATCH};
use super::device::Device;
use crate::RuntimeError;
use crate::plan::{BufferRef, Plan};
use coconet_core::{Bindings, DType, ValueId, block_range};
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
        let p = plan.program();
        let bound = plan.bind(bindings)?;
        let mut buffers = HashMap::new();
        for (&id, per_rank) in &bound.tensors {
            for (r, data) in per_rank.iter().enumerate() {
                if let Some(d) = data {
                    let b = device.upload(p.node(id).ty.dtype, d)?;
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
            .map(|_| device.zeros(DType::F64, SCRATCH))
            .collect::<Result<_, _>>()?;
        Ok(DeviceJob {
            plan: plan.clone(),
            program,
            buffers,
            scratch,
            scalars: bound.scalars,
            uniform: HashMap::new(),
            grid,
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
        for i in 0..self.program.steps.len() {
            match self.program.steps[i].clone() {
                GpuStep::Uniform(vs) => {
                    crate::cpu::exec::uniform_values(
                        self.plan.program(),
                        &vs,
                        &self.scalars,
                        &mut self.uniform,
                    );
                }
                GpuStep::Launch(ls) => {
                    for l in &ls {
                        self.launch(device, l, l.lo, l.hi)?;
                    }
                }
                GpuStep::MatMul(ms) => {
                    for m in &ms {
                        let (a, b, o) = (
                            self.address(device, &m.a)?,
                            self.address(device, &m.b)?,
                            self.address(device, &m.out)?,
                        );
                        device.gemm(m, a, b, o, 0..m.m)?;
                    }
                    // Later kernels (on the communication stream) wait for the matmuls.
                    device.block_done()?;
                    device.wait_block()?;
                }
                GpuStep::Overlap {
                    matmuls,
                    blocks,
                    fused,
                    rows,
                } => {
                    let first = matmuls
                        .first()
                        .map(|m| m.m / m.rows_per_block.max(1))
                        .unwrap_or(0);
                    for c in 0..blocks {
                        let r = block_range(first, blocks, c);
                        for m in &matmuls {
                            let (a, b, o) = (
                                self.address(device, &m.a)?,
                                self.address(device, &m.b)?,
                                self.address(device, &m.out)?,
                            );
                            let per = m.rows_per_block;
                            device.gemm(m, a, b, o, r.start * per..r.end * per)?;
                        }
                        device.block_done()?;
                        device.wait_block()?;
                        for (l, &(start_row, inner)) in fused.iter().zip(&rows) {
                            // My positions whose rows this block finished.
                            let rows_mine = l.hi / inner.max(1);
                            let lo = r.start.clamp(start_row, start_row + rows_mine) - start_row;
                            let hi = r.end.clamp(start_row, start_row + rows_mine) - start_row;
                            if hi > lo {
                                self.launch(device, l, lo * inner, hi * inner)?;
                            }
                        }
                    }
                }
            }
        }
        device.synchronize()
    }

    fn launch(&self, device: &D, l: &Launch, lo: usize, hi: usize) -> Result<(), RuntimeError> {
        let threads = l.threads(lo, hi);
        if threads == 0 {
            return Ok(());
        }
        // Argument storage: every value lives in `words` (pointer arrays in `arrays`)
        // until the launch returns.
        let mut words: Vec<u64> = Vec::new();
        let mut arrays: Vec<D::Buffer> = Vec::new();
        let mut slots: Vec<usize> = Vec::new();
        for a in &l.args {
            match a {
                Arg::Range => {
                    words.push(lo as u64);
                    words.push(hi as u64);
                    slots.extend([words.len() - 2, words.len() - 1]);
                }
                Arg::Ptr(p) => {
                    words.push(self.address(device, p)?);
                    slots.push(words.len() - 1);
                }
                Arg::Ptrs(ps) => {
                    let addrs = ps
                        .iter()
                        .map(|p| self.address(device, p))
                        .collect::<Result<Vec<_>, _>>()?;
                    let buf = device.addresses(&addrs)?;
                    words.push(device.address(&buf));
                    arrays.push(buf);
                    slots.push(words.len() - 1);
                }
                Arg::I64(x) => {
                    words.push(*x as u64);
                    slots.push(words.len() - 1);
                }
                Arg::Uniform(v) => {
                    let x = self.uniform.get(v).copied().ok_or_else(|| {
                        RuntimeError::Plan(format!(
                            "scalar `{}` is used before it is computed",
                            self.plan.program().label(*v)
                        ))
                    })?;
                    words.push(x.to_bits());
                    slots.push(words.len() - 1);
                }
                Arg::Scratch(r) => {
                    words.push(device.address(&self.scratch[*r]));
                    slots.push(words.len() - 1);
                }
            }
        }
        let mut ptrs: Vec<*mut c_void> = slots
            .iter()
            .map(|&i| (&mut words[i] as *mut u64).cast())
            .collect();
        let grid = match l.mode {
            Mode::Threads(_) => 1,
            _ => self
                .grid
                .unwrap_or_else(|| threads.div_ceil(BLOCK as usize).clamp(1, 65_535) as u32),
        };
        let block = match l.mode {
            Mode::Threads(t) => t as u32,
            _ => BLOCK.min(threads as u32).max(1),
        };
        device.launch(l.kernel, grid, block, &mut ptrs)?;
        // Pointer arrays must outlive the kernel: wait before dropping them.
        if !arrays.is_empty() {
            device.synchronize()?;
        }
        drop(arrays);
        Ok(())
    }

    /// Every rank's data of `v` (empty for ranks without it), as f64.
    pub fn values(&self, device: &D, v: ValueId) -> Result<Vec<Vec<f64>>, RuntimeError> {
        let p = self.plan.program();
        (0..self.plan.ranks())
            .map(|r| {
                if !self.plan.holders(v).contains(&r) {
                    return Ok(vec![]);
                }
                if let Some(x) = self.uniform.get(&v) {
                    return Ok(vec![*x]);
                }
                let view = self.plan.view(v, r).ok_or_else(|| {
                    RuntimeError::Read(format!("`{}` is not kept in memory", p.label(v)))
                })?;
                let b = &self.buffers[&(r, view.buffer)];
                let (dtype, len) = match view.buffer {
                    BufferRef::Input(t) => (
                        p.node(t).ty.dtype,
                        coconet_core::interp::tensor::numel(&self.plan.local_shape(t, r)),
                    ),
                    BufferRef::Slot(s) => {
                        (self.plan.slots()[s].dtype, self.plan.slots()[s].elements[r])
                    }
                };
                Ok(view.gather(&device.download(b, dtype, len)?))
            })
            .collect()
    }

    /// Every rank's data of tensor input `name` after the run (updates included).
    pub fn input_values(&self, device: &D, name: &str) -> Result<Vec<Vec<f64>>, RuntimeError> {
        let p = self.plan.program();
        let id = p
            .find(name)
            .filter(|&i| matches!(p.node(i).op, coconet_core::Op::TensorInput))
            .ok_or_else(|| RuntimeError::Read(format!("no tensor input named `{name}`")))?;
        let dtype = p.node(id).ty.dtype;
        (0..self.plan.ranks())
            .map(|r| match self.buffers.get(&(r, BufferRef::Input(id))) {
                Some(b) => device.download(
                    b,
                    dtype,
                    coconet_core::interp::tensor::numel(&self.plan.local_shape(id, r)),
                ),
                None => Ok(vec![]),
            })
            .collect()
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
