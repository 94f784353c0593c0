//! Running a [`CudaProgram`] on a [`Device`] with virtual ranks: every rank's buffers
//! live on the one device, so peer pointers are plain device pointers, and each rank's
//! launches of a step are issued in rank order on one stream, so a launch sees what the
//! launches before it wrote and no flags are needed between ranks. An overlapped
//! matmul runs block by block; after each block every rank's fused all-reduce is
//! launched on the rows that block finished. The order of launches, matmuls and events
//! is [`exchange_plan`](crate::actions::exchanged)'s, shared with ranks that have separate
//! memories.

use crate::actions::Action;
use crate::actions::exchanged::{Pipelining, actions};
use crate::codegen::{Arg, CudaProgram, Launch, Mode, PtrArg};
use crate::devices::{Device, KernelCall};
use crate::executors::launch_graph::{GraphStats, LaunchGraphs};
use crate::executors::lending::{Lending, Piece, after_failure, unsegmentable};
use crate::executors::reads::{copy_checked, read_raw, read_value};
use crate::lent::{DeviceSlice, Lent};
use coconet_core::{Bindings, DType, ValueId};
use coconet_plan::RuntimeError;
use coconet_plan::plan::{BufferRef, Plan};
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

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
    /// Memory lent to the runs.
    lending: Lending,
    /// Buffers lent pieces of which are gathered rather than taken in place.
    unsegmentable: HashSet<(usize, BufferRef)>,
    /// Why the last run failed: the buffers may hold part of a step, so they are neither
    /// run nor read again.
    failed: Option<String>,
    /// The runs' launches as graphs, a segment each between matmuls (`None`: launched
    /// one by one).
    graphs: Option<LaunchGraphs<D::Graph>>,
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
        let unsegmentable = unsegmentable(&actions, &program, None);
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
            lending: Lending::default(),
            unsegmentable,
            failed: None,
            graphs: None,
        })
    }

    /// The device address of rank `rank`'s buffer `b`: the caller's lent memory during a
    /// lending run, else the job's own.
    fn base(&self, device: &D, rank: usize, b: BufferRef) -> Result<u64, RuntimeError> {
        match self.lending.address((rank, b)) {
            Some(at) => Ok(at),
            None => self.own(device, rank, b),
        }
    }

    /// The device address of the job's own buffer `b` of rank `rank`.
    fn own(&self, device: &D, rank: usize, b: BufferRef) -> Result<u64, RuntimeError> {
        let buf = self.buffers.get(&(rank, b)).ok_or_else(|| {
            RuntimeError::Plan(format!(
                "rank {rank} has no buffer {b:?} (a value outside its group)"
            ))
        })?;
        Ok(device.address(buf))
    }

    fn address(&self, device: &D, p: &PtrArg) -> Result<u64, RuntimeError> {
        let size = crate::actions::buffer_size(&self.plan, p.buffer);
        Ok(self.base(device, p.rank, p.buffer)? + (p.offset * size) as u64)
    }

    /// An error once a run has failed (the buffers may hold part of a step).
    fn usable(&self) -> Result<(), RuntimeError> {
        match &self.failed {
            None => Ok(()),
            Some(e) => Err(after_failure(e)),
        }
    }

    /// Runs every step once and waits for it.
    pub fn run(&mut self, device: &D) -> Result<(), RuntimeError> {
        let done = self.run_lent(device, &Lent::new(), None)?;
        self.wait(device, &done)
    }

    /// Waits on the host for a run's `event`; a fault it reports (the device's work of a
    /// queued run failed) leaves the job failed, as a run that failed to queue does.
    pub fn wait(&mut self, device: &D, event: &D::Event) -> Result<(), RuntimeError> {
        device
            .wait_host(event)
            .inspect_err(|e| self.failed = Some(e.to_string()))
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
        let buffers = &self.buffers;
        self.lending.begin(
            device,
            &self.plan,
            lent,
            &|_| true,
            &|k| buffers.contains_key(&k),
            true,
            &self.unsegmentable,
        )?;
        let queued = self.queue_lent(device, lent, after);
        self.lending.finish(device, lent, queued, &mut self.failed)
    }

    /// Orders the run after `after` and the lenders, gathers pieces in, queues the
    /// steps, scatters updated pieces out.
    fn queue_lent(
        &mut self,
        device: &D,
        lent: &Lent<'_>,
        after: Option<&D::Event>,
    ) -> Result<(), RuntimeError> {
        Lending::order(device, lent, after)?;
        let own = |(r, b)| self.own(device, r, b);
        self.lending.gather(device, &own)?;
        self.enqueue(device)?;
        let own = |(r, b)| self.own(device, r, b);
        self.lending.scatter(device, &own)
    }

    /// Makes later runs queue their launches as graphs (`on`: one for each run of
    /// launches between matmuls), or one by one.
    pub fn use_graph(&mut self, on: bool) {
        LaunchGraphs::switch(&mut self.graphs, on)
    }

    /// What the runs' graphs have cost so far (`None` without graphs).
    pub fn graph_stats(&self) -> Option<GraphStats> {
        self.graphs.as_ref().map(LaunchGraphs::stats)
    }

    /// Queues every step once.
    fn enqueue(&mut self, device: &D) -> Result<(), RuntimeError> {
        self.uniform.clear();
        if let Some(graphs) = &mut self.graphs {
            graphs.begin();
        }
        for i in 0..self.actions.len() {
            // With graphs, the launches since the last other work go first, as one.
            let launch = matches!(self.actions[i], Action::Launch { .. } | Action::Uniform(_));
            if let (false, Some(graphs)) = (launch, &mut self.graphs) {
                graphs.cut(device)?;
            }
            match &self.actions[i] {
                Action::Uniform(vs) => {
                    let vs = vs.clone();
                    coconet_plan::plan::uniform_values(
                        self.plan.program(),
                        &vs,
                        &self.scalars,
                        &mut self.uniform,
                    );
                }
                Action::Launch { launch, lo, hi, .. } => {
                    if let Some(call) = self.call(device, i, launch, *lo, *hi)? {
                        match &mut self.graphs {
                            Some(graphs) => graphs.push(call),
                            None => device.launch(&call)?,
                        }
                    }
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
        match &mut self.graphs {
            Some(graphs) => graphs.cut(device),
            None => Ok(()),
        }
    }

    /// Launch site `site`'s call of `l` over positions `lo..hi`.
    fn call(
        &self,
        device: &D,
        site: usize,
        l: &Launch,
        lo: usize,
        hi: usize,
    ) -> Result<Option<KernelCall>, RuntimeError> {
        let scratch = device.address(&self.scratch[l.rank]);
        kernel_call(
            device,
            &self.plan,
            site,
            l,
            (lo, hi),
            self.grid,
            &self.uniform,
            scratch,
            &self.arrays,
            Pointers {
                ptr: &mut |_, _, p| self.address(device, p),
                pieces: &|p| self.lending.pieces((p.rank, p.buffer)),
                twin: self.program.kernels[l.kernel].segments,
            },
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
    /// size, and the rank holds `v`: checked by the caller); downloads that rank's data
    /// only.
    pub fn read_bytes(
        &self,
        device: &D,
        v: ValueId,
        rank: usize,
        out: &mut [u8],
    ) -> Result<(), RuntimeError> {
        self.readable(v, rank)?;
        read_raw(device, &self.plan, v, rank, &self.uniform, out, &mut |b| {
            self.base(device, rank, b).ok()
        })?;
        Ok(())
    }

    /// Copies rank `rank`'s data of `v` to the caller's memory `dst` (its dtype, length
    /// and memory checked by the caller), ordered with the kernels.
    pub fn copy_to(
        &self,
        device: &D,
        v: ValueId,
        rank: usize,
        dst: &DeviceSlice<'_>,
    ) -> Result<(), RuntimeError> {
        self.readable(v, rank)?;
        copy_checked(device, &self.plan, v, rank, dst, &mut |b| {
            self.base(device, rank, b).ok()
        })
    }

    /// Refuses reads after a failed run and of buffers lent in the last run.
    fn readable(&self, v: ValueId, rank: usize) -> Result<(), RuntimeError> {
        self.usable()?;
        self.lending.check_read(&self.plan, v, rank)
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
        self.lending.written((rank, BufferRef::Input(id)));
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

/// How a launch finds its pointers: `ptr(arg, k, p)` the device address of pointer `k`
/// of argument `arg` (0 for a single pointer), `pieces(p)` the lent pieces standing for
/// `p`'s buffer during this run (taken through the kernel's segmented twin), `twin` that
/// twin's index.
pub(crate) struct Pointers<'a> {
    pub(crate) ptr: &'a mut dyn FnMut(usize, usize, &PtrArg) -> Result<u64, RuntimeError>,
    pub(crate) pieces: &'a dyn Fn(&PtrArg) -> Option<&'a [Piece]>,
    pub(crate) twin: Option<usize>,
}

/// The launch of `l` over positions `lo..hi` on `device` (`None` for no positions), as
/// one launch of its segmented twin where a pointer reaches lent pieces. Pointer arrays
/// and segment tables it reads are written on the device, ordered before it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn kernel_call<D: Device>(
    device: &D,
    plan: &Plan,
    site: usize,
    l: &Launch,
    (lo, hi): (usize, usize),
    grid: Option<u32>,
    uniform: &HashMap<ValueId, f64>,
    scratch: u64,
    arrays: &PointerArrays<D::Buffer>,
    at: Pointers<'_>,
) -> Result<Option<KernelCall>, RuntimeError> {
    let threads = l.threads(lo, hi);
    if threads == 0 {
        return Ok(None);
    }
    let Pointers { ptr, pieces, twin } = at;
    let pieced = |arg: &Arg| match arg {
        Arg::Ptr(p, _) => pieces(p).is_some(),
        Arg::Reads(ps) | Arg::Writes(ps) => ps.iter().any(|p| pieces(p).is_some()),
        _ => false,
    };
    // Argument storage: every value lives in `words` until the launch returns.
    let mut words: Vec<u64> = Vec::new();
    let mut rows = None;
    let kernel = if l.args.iter().any(pieced) {
        let twin = twin.ok_or_else(|| {
            RuntimeError::Plan(
                "internal error, please report it: lent pieces reach a kernel without a \
                 segmented twin"
                    .into(),
            )
        })?;
        let table = segment_table(plan, l, (lo, hi), scratch, ptr, pieces)?;
        let nsegs = table.rows as u64;
        rows = Some(table.rows);
        let base = arrays.table(device, (site, usize::MAX), table.words.len(), |base| {
            table.resolve(base)
        })?;
        words.extend([base, nsegs]);
        for arg in &l.args {
            if let Some(x) = scalar(plan, uniform, arg)? {
                words.push(x);
            }
        }
        twin
    } else {
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
                Arg::I64(_) | Arg::Uniform(_) => {
                    words.extend(scalar(plan, uniform, arg)?);
                }
                Arg::Scratch { offset, .. } => words.push(scratch + 8 * *offset as u64),
            }
        }
        l.kernel
    };
    let block = match l.mode {
        Mode::Threads(t) => t as u32,
        Mode::Blocks => coconet_core::numerics::REDUCE_LANES as u32,
        Mode::Rows(_) => coconet_core::numerics::ROW_LANES as u32,
        _ => BLOCK.min(threads as u32).max(1),
    };
    let grid = match (l.mode, rows) {
        // A block per row of the segment table.
        (_, Some(rows)) => grid.unwrap_or(rows.clamp(1, 65_535) as u32),
        (Mode::Threads(_), None) => 1,
        _ => grid.unwrap_or_else(|| threads.div_ceil(block as usize).clamp(1, 65_535) as u32),
    };
    let block = if rows.is_some() { BLOCK } else { block };
    Ok(Some(KernelCall {
        kernel,
        grid,
        block,
        words,
    }))
}

/// The value of a scalar argument (`None` for the others).
fn scalar(
    plan: &Plan,
    uniform: &HashMap<ValueId, f64>,
    arg: &Arg,
) -> Result<Option<u64>, RuntimeError> {
    Ok(match arg {
        Arg::I64(x) => Some(*x as u64),
        Arg::Uniform(v) => {
            let x = uniform.get(v).copied().ok_or_else(|| {
                RuntimeError::Plan(format!(
                    "scalar `{}` is used before it is computed",
                    plan.program().label(*v)
                ))
            })?;
            Some(x.to_bits())
        }
        _ => None,
    })
}

/// A segmented twin's table: per segment `lo, hi` and the pointer arguments' values (a
/// pointer array's being the address of its copy after the rows).
struct SegmentTable {
    rows: usize,
    /// Rows, then the arrays; words marked in `arrays_at` hold an offset into the table
    /// (in words) until the table's address is known.
    words: Vec<u64>,
    arrays_at: Vec<usize>,
}

impl SegmentTable {
    /// The words with array offsets turned into addresses, the table being at `base`.
    fn resolve(&self, base: u64) -> Vec<u64> {
        let mut w = self.words.clone();
        for &i in &self.arrays_at {
            w[i] = base + 8 * w[i];
        }
        w
    }
}

/// Cuts positions `lo..hi` where any lent piece a pointer reaches begins, and gives each
/// segment its pointers: within a segment every pointer addresses one piece (position
/// `i` is element `offset + i` of its buffer, as in the plain kernel).
fn segment_table<'a>(
    plan: &Plan,
    l: &Launch,
    (lo, hi): (usize, usize),
    scratch: u64,
    ptr: &mut dyn FnMut(usize, usize, &PtrArg) -> Result<u64, RuntimeError>,
    pieces: &dyn Fn(&PtrArg) -> Option<&'a [Piece]>,
) -> Result<SegmentTable, RuntimeError> {
    let mut cuts = vec![lo, hi];
    let every = l.args.iter().flat_map(|arg| match arg {
        Arg::Ptr(p, _) => std::slice::from_ref(p),
        Arg::Reads(ps) | Arg::Writes(ps) => &ps[..],
        _ => &[],
    });
    for p in every {
        for piece in pieces(p).unwrap_or_default() {
            if piece.start > p.offset + lo && piece.start < p.offset + hi {
                cuts.push(piece.start - p.offset);
            }
        }
    }
    // Rows of at most CHUNK positions: a block each.
    let chunk = crate::codegen::segments::CHUNK;
    cuts.extend((lo..hi).step_by(chunk).skip(1));
    cuts.sort_unstable();
    cuts.dedup();
    // Pointer `p`'s value for a segment starting at position `x`.
    let mut value = |a: usize, k: usize, p: &PtrArg, x: usize| -> Result<u64, RuntimeError> {
        let Some(ps) = pieces(p) else {
            return ptr(a, k, p);
        };
        let e = p.offset + x;
        // Pieces tile the buffer in order: the first that ends after `e` holds it.
        let piece = ps
            .get(ps.partition_point(|q| q.start + q.len <= e))
            .filter(|q| q.start <= e)
            .ok_or_else(|| {
                RuntimeError::Plan(format!(
                    "internal error, please report it: element {e} is in no lent piece"
                ))
            })?;
        let size = crate::actions::buffer_size(plan, p.buffer) as i64;
        Ok((piece.address as i64 + (p.offset as i64 - piece.start as i64) * size) as u64)
    };
    let mut rows = Vec::new();
    let mut arrays: Vec<Vec<u64>> = Vec::new();
    let mut arrays_at = Vec::new();
    let mut count = 0;
    for w in cuts.windows(2) {
        let (x, y) = (w[0], w[1]);
        count += 1;
        rows.extend([x as u64, y as u64]);
        for (a, arg) in l.args.iter().enumerate() {
            match arg {
                Arg::Ptr(p, _) => rows.push(value(a, 0, p, x)?),
                Arg::Reads(ps) | Arg::Writes(ps) => {
                    let addrs = ps
                        .iter()
                        .enumerate()
                        .map(|(k, p)| value(a, k, p, x))
                        .collect::<Result<Vec<_>, _>>()?;
                    arrays_at.push(rows.len());
                    rows.push(arrays.len() as u64);
                    arrays.push(addrs);
                }
                Arg::Scratch { offset, .. } => rows.push(scratch + 8 * *offset as u64),
                Arg::Range | Arg::I64(_) | Arg::Uniform(_) => {}
            }
        }
    }
    // Array `j`'s words start after the rows and the arrays before it.
    let mut at = rows.len();
    let mut starts = Vec::with_capacity(arrays.len());
    for a in &arrays {
        starts.push(at as u64);
        at += a.len();
    }
    for &i in &arrays_at {
        rows[i] = starts[rows[i] as usize];
    }
    rows.extend(arrays.into_iter().flatten());
    Ok(SegmentTable {
        rows: count,
        words: rows,
        arrays_at,
    })
}

/// The device arrays of peer pointers a job's launches pass: one per launch site (an
/// action and its argument), kept for the job's life and rewritten, ordered with the
/// kernels, only when its content changes (memory lent to a run moves an address).
/// Launches neither allocate nor wait for the device to free, and the number of arrays
/// is bounded by the plan, however many different addresses are lent.
pub(crate) struct PointerArrays<B>(RefCell<HashMap<Site, (Vec<u64>, B)>>, RefCell<Vec<B>>);

/// A launch site: an action of a run and one of its arguments.
type Site = (usize, usize);

impl<B> PointerArrays<B> {
    pub(crate) fn new() -> Self {
        PointerArrays(RefCell::new(HashMap::new()), RefCell::new(Vec::new()))
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

    /// The device address of launch site `site`'s table of `len` words, holding
    /// `content(address)`. A table of another length replaces the site's (the old one is
    /// kept: launches queued before may still read it).
    fn table<D: Device<Buffer = B>>(
        &self,
        device: &D,
        site: Site,
        len: usize,
        content: impl FnOnce(u64) -> Vec<u64>,
    ) -> Result<u64, RuntimeError> {
        let mut arrays = self.0.borrow_mut();
        if let Some((held, b)) = arrays.get_mut(&site)
            && held.len() == len
        {
            let words = content(device.address(b));
            if *held != words {
                let bytes: Vec<u8> = words.iter().flat_map(|a| a.to_ne_bytes()).collect();
                device.write(b, &bytes)?;
                *held = words;
            }
            return Ok(device.address(b));
        }
        let b = device.addresses(&vec![0; len.max(1)])?;
        let at = device.address(&b);
        let words = content(at);
        let bytes: Vec<u8> = words.iter().flat_map(|a| a.to_ne_bytes()).collect();
        device.write(&b, &bytes)?;
        if let Some((_, old)) = arrays.insert(site, (words, b)) {
            self.1.borrow_mut().push(old);
        }
        Ok(at)
    }
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
