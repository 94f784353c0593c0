//! A step's launches as a CUDA graph (cargo feature `cuda`): built node by node from
//! the launches a run would issue (each after the one before, as on one stream),
//! instantiated once, replayed with one `cuGraphLaunch` per step; a launch whose
//! arguments change between steps (the step count's bias corrections, a new learning
//! rate, memory lent at other addresses) is updated in the instantiated graph
//! (`cuGraphExecKernelNodeSetParams`), which affects later replays only.

use crate::devices::KernelCall;
use cudarc::driver::{CudaContext, CudaFunction, sys};
use std::ptr;
use std::sync::Arc;

/// An instantiated graph of kernel launches (destroyed on drop).
pub struct GpuGraph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    /// Node `i` launches call `i`.
    nodes: Vec<sys::CUgraphNode>,
    ctx: Arc<CudaContext>,
}

// SAFETY: the handles are the driver's, valid on any thread of the process; every use
// binds the graph's context first, and `&mut self` (or ownership) serialises them, as a
// job is used by one thread at a time.
unsafe impl Send for GpuGraph {}

fn checked(what: &str, r: sys::CUresult) -> Result<(), String> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what}: {r:?}"))
    }
}

/// Node parameters launching `call` of `functions`; `args` points at `words` (kept alive
/// by the caller until the driver has copied them, i.e. until the call returns).
fn params(
    functions: &[CudaFunction],
    call: &KernelCall,
    args: &mut [*mut std::ffi::c_void],
) -> sys::CUDA_KERNEL_NODE_PARAMS {
    sys::CUDA_KERNEL_NODE_PARAMS {
        func: functions[call.kernel].cu_function(),
        gridDimX: call.grid,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: call.block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        kernelParams: args.as_mut_ptr(),
        extra: ptr::null_mut(),
        kern: ptr::null_mut(),
        ctx: ptr::null_mut(),
    }
}

impl GpuGraph {
    /// A graph launching `calls` one after another, instantiated in `ctx` (current on
    /// this thread).
    pub(crate) fn new(
        ctx: &Arc<CudaContext>,
        functions: &[CudaFunction],
        calls: &[KernelCall],
    ) -> Result<GpuGraph, String> {
        let mut graph: sys::CUgraph = ptr::null_mut();
        // SAFETY: `graph` is written on success.
        checked("cuGraphCreate", unsafe {
            sys::cuGraphCreate(&mut graph, 0)
        })?;
        let mut g = GpuGraph {
            graph,
            exec: ptr::null_mut(),
            nodes: Vec::with_capacity(calls.len()),
            ctx: ctx.clone(),
        };
        for call in calls {
            let mut args = call.argument_pointers();
            let p = params(functions, call, &mut args);
            let deps: &[sys::CUgraphNode] = match g.nodes.last() {
                Some(last) => std::slice::from_ref(last),
                None => &[],
            };
            let mut node: sys::CUgraphNode = ptr::null_mut();
            // SAFETY: the graph is live, `deps` are nodes of it, `p` points at the
            // arguments (copied by the driver before it returns) of a kernel of this
            // context, matching its parameter list.
            checked("cuGraphAddKernelNode", unsafe {
                sys::cuGraphAddKernelNode_v2(&mut node, g.graph, deps.as_ptr(), deps.len(), &p)
            })?;
            g.nodes.push(node);
        }
        // SAFETY: `exec` is written on success; the graph is complete.
        checked("cuGraphInstantiateWithFlags", unsafe {
            sys::cuGraphInstantiateWithFlags(&mut g.exec, g.graph, 0)
        })?;
        Ok(g)
    }

    /// Makes node `i` launch `call` from the next replay on.
    pub(crate) fn update(
        &mut self,
        functions: &[CudaFunction],
        i: usize,
        call: &KernelCall,
    ) -> Result<(), String> {
        let node = *self
            .nodes
            .get(i)
            .ok_or_else(|| format!("a graph of {} launches has no launch {i}", self.nodes.len()))?;
        let mut args = call.argument_pointers();
        let p = params(functions, call, &mut args);
        // SAFETY: `node` is a kernel node of the graph `exec` was instantiated from; the
        // arguments are copied before the call returns.
        checked("cuGraphExecKernelNodeSetParams", unsafe {
            sys::cuGraphExecKernelNodeSetParams_v2(self.exec, node, &p)
        })
    }

    /// Queues the graph on `stream`.
    pub(crate) fn launch(&self, stream: sys::CUstream) -> Result<(), String> {
        // SAFETY: an instantiated graph of this context and a stream of it.
        checked("cuGraphLaunch", unsafe {
            sys::cuGraphLaunch(self.exec, stream)
        })
    }
}

impl Drop for GpuGraph {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: created above, destroyed once; replays already queued keep what
            // they need (the driver defers the release of a graph in use).
            unsafe {
                if !self.exec.is_null() {
                    sys::cuGraphExecDestroy(self.exec);
                }
                sys::cuGraphDestroy(self.graph);
            }
        }
    }
}
