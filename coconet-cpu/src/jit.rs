//! Pointwise f32 kernels compiled to machine code at run time (Cranelift). The stage
//! loops of [`super::kernel`] make one pass over a chunk per stage, each writing a
//! chunk-sized register: a 20-stage optimizer step moves twenty chunks through the cache
//! per chunk of memory it updates. Compiled, every stage of an element is computed in
//! vector registers and only the kernel's inputs and outputs touch memory — one pass.
//!
//! The machine code performs the stage loops' IEEE operations (`+ − × ÷ √`, negation,
//! absolute value, select) on the same f32 operands in the same order, and Cranelift
//! never contracts a multiply and an add into a fused multiply-add, so the results are
//! the same bits. What a graph can express is exactly that, and a fused all-reduce's
//! reduction (f32 operands summed in f64 in rank order, rounded once): nothing else is
//! compiled.
//!
//! Code is cached by the graph (operations and operand kinds, neither addresses nor
//! constants, which are arguments): a training loop compiles each of its kernels once
//! per process. `COCONET_JIT=0` in the environment turns compilation off (every kernel
//! on its stage loops), for comparisons.

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{
    AbiParam, ConstantData, Endianness, InstBuilder, MemFlagsData, Type, Value, types,
};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::Module;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// One value of a graph, per element, from earlier values (indices into the nodes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Node {
    /// Element i of input pointer k.
    Load(usize),
    /// Scalar argument k, the same for every element.
    Scalar(usize),
    Neg(usize),
    Abs(usize),
    Sqrt(usize),
    Add(usize, usize),
    Sub(usize, usize),
    Mul(usize, usize),
    Div(usize, usize),
    /// `if c != 0 { a } else { b }` (a NaN `c` is not zero).
    Select(usize, usize, usize),
    /// The sum of nodes `first..first + count` in f64, in that order, divided by scalar
    /// argument `mean` if there is one, rounded once to f32: a reduction in rank order
    /// (see `collective::reduce_f32_slices`, which computes the same).
    Sum {
        first: usize,
        count: usize,
        mean: Option<usize>,
    },
}

/// What a compiled kernel computes for elements `0..n`: its nodes in order, then the
/// value each output pointer receives. Every input is read before any output is written
/// for the same elements (a kernel may update a buffer it reads, element for element).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Graph {
    pub nodes: Vec<Node>,
    /// Input pointers (the first pointer arguments).
    pub inputs: usize,
    /// Scalar arguments.
    pub scalars: usize,
    /// Per output pointer (after the inputs), the node stored there.
    pub outputs: Vec<usize>,
}

/// The machine code's signature: input then output pointers, scalars, element count.
type Entry = unsafe extern "C" fn(*const *mut f32, *const f32, usize);

/// A compiled graph. It lives as long as the process (the cache never frees code).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Code {
    entry: Entry,
    pointers: usize,
    scalars: usize,
}

impl Code {
    /// Computes elements `0..n`.
    ///
    /// # Safety
    /// `pointers` holds the graph's inputs then outputs, each valid for `n` f32 (reads
    /// for inputs, writes for outputs), and no other thread writes those elements or
    /// reads the outputs' meanwhile. Pointers may share elements only at identical
    /// positions (an output over its input: every input of an element is read before
    /// any output of it is written; two outputs: written in the graph's order).
    #[inline]
    pub unsafe fn run(&self, pointers: &[*mut f32], scalars: &[f32], n: usize) {
        assert!(pointers.len() == self.pointers && scalars.len() == self.scalars);
        // SAFETY: the code reads `pointers` and `scalars` (lengths checked just above)
        // and elements 0..n through them (the caller's promise).
        unsafe { (self.entry)(pointers.as_ptr(), scalars.as_ptr(), n) }
    }
}

/// Whether kernels are compiled (`COCONET_JIT=0` in the environment turns it off).
pub(crate) fn enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var("COCONET_JIT").as_deref() != Ok("0"))
}

/// The graph's code: compiled once per process, then from the cache. `None` when
/// compilation is off or the host has no Cranelift backend (the stage loops run).
pub(crate) fn compile(graph: &Graph) -> Option<Code> {
    if !enabled() {
        return None;
    }
    // Rank threads prepare their kernels every run: each keeps what it has looked up,
    // so a run takes no lock (4 rank threads on 2 cores waited on each other's).
    thread_local! {
        static SEEN: std::cell::RefCell<HashMap<Graph, Option<Code>>> =
            std::cell::RefCell::default();
    }
    if let Some(code) = SEEN.with(|seen| seen.borrow().get(graph).copied()) {
        return code;
    }
    let code = compile_shared(graph);
    SEEN.with(|seen| seen.borrow_mut().insert(graph.clone(), code));
    code
}

/// [`compile`] through the process's cache.
fn compile_shared(graph: &Graph) -> Option<Code> {
    static JIT: OnceLock<Option<Mutex<Jit>>> = OnceLock::new();
    let jit = JIT.get_or_init(|| Jit::new().map(Mutex::new)).as_ref()?;
    let mut jit = jit.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(code) = jit.code.get(graph) {
        return *code;
    }
    // A graph that failed to compile (e.g. no executable memory) is not tried again.
    let code = jit.define(graph).ok();
    jit.code.insert(graph.clone(), code);
    code
}

/// The process's code generator and its compiled graphs.
struct Jit {
    module: JITModule,
    builder: FunctionBuilderContext,
    /// Compiled graphs, and those that failed to compile (`None`).
    code: HashMap<Graph, Option<Code>>,
}

/// Memory flags of kernel accesses: in bounds (the caller's promise), any alignment.
const MEM: MemFlagsData = MemFlagsData::new().with_notrap();

impl Jit {
    fn new() -> Option<Jit> {
        let mut flags = settings::builder();
        flags.set("opt_level", "speed").ok()?;
        let isa = cranelift_native::builder()
            .ok()?
            .finish(settings::Flags::new(flags))
            .ok()?;
        let module = JITModule::new(JITBuilder::with_isa(
            isa,
            cranelift_module::default_libcall_names(),
        ));
        Some(Jit {
            module,
            builder: FunctionBuilderContext::new(),
            code: HashMap::new(),
        })
    }

    /// Compiles `g`: a loop over whole groups of 16 elements (four vectors of 4 lanes:
    /// more loads in flight, fewer branches), then one over groups of 4, then one over
    /// single elements.
    fn define(&mut self, g: &Graph) -> Result<Code, String> {
        let ptr = self.module.target_config().pointer_type();
        let mut ctx = self.module.make_context();
        ctx.func.signature.params.extend([
            AbiParam::new(ptr),
            AbiParam::new(ptr),
            AbiParam::new(ptr),
        ]);
        {
            let mut b = FunctionBuilder::new(&mut ctx.func, &mut self.builder);
            let entry = b.create_block();
            b.append_block_params_for_function_params(entry);
            b.switch_to_block(entry);
            let &[pointers, scalars, n] = b.block_params(entry) else {
                unreachable!("three parameters")
            };
            let step = i32::from(ptr.bytes() as u8);
            let args: Vec<Value> = (0..g.inputs + g.outputs.len())
                .map(|k| b.ins().load(ptr, MEM, pointers, step * k as i32))
                .collect();
            let one: Vec<Value> = (0..g.scalars)
                .map(|k| b.ins().load(types::F32, MEM, scalars, 4 * k as i32))
                .collect();
            let four: Vec<Value> = one
                .iter()
                .map(|&s| b.ins().splat(types::F32X4, s))
                .collect();
            let zero = b.ins().iconst(ptr, 0);
            let sixteens = b.ins().band_imm_s(n, -16);
            let fours = b.ins().band_imm_s(n, -4);
            let lanes = Lanes {
                g,
                ptr,
                args: &args,
            };
            lanes.emit_loop(&mut b, (types::F32X4, 4), &four, zero, sixteens);
            lanes.emit_loop(&mut b, (types::F32X4, 1), &four, sixteens, fours);
            lanes.emit_loop(&mut b, (types::F32, 1), &one, fours, n);
            b.ins().return_(&[]);
            b.seal_all_blocks();
            b.finalize(self.module.target_config());
        }
        let id = self
            .module
            .declare_anonymous_function(&ctx.func.signature)
            .map_err(|e| e.to_string())?;
        self.module
            .define_function(id, &mut ctx)
            .map_err(|e| e.to_string())?;
        self.module.clear_context(&mut ctx);
        self.module
            .finalize_definitions()
            .map_err(|e| e.to_string())?;
        let code = self.module.get_finalized_function(id);
        // SAFETY: the function was declared with `Entry`'s signature (three pointer-sized
        // parameters, no result, the platform's C convention, the module's default).
        let entry = unsafe { std::mem::transmute::<*const u8, Entry>(code) };
        Ok(Code {
            entry,
            pointers: g.inputs + g.outputs.len(),
            scalars: g.scalars,
        })
    }
}

/// A graph's loop bodies, emitted for a lane type.
struct Lanes<'a> {
    g: &'a Graph,
    ptr: Type,
    /// The pointer arguments.
    args: &'a [Value],
}

impl Lanes<'_> {
    /// `for i in (from..to).step_by(copies × lanes) { outputs[i..] = graph(inputs[i..]) }`
    /// with the body repeated `copies` times at consecutive positions (`to − from` is a
    /// multiple of the step), leaving the builder after the loop. The test is at the
    /// bottom: one branch per iteration.
    fn emit_loop(
        &self,
        b: &mut FunctionBuilder,
        (ty, copies): (Type, u32),
        scalars: &[Value],
        from: Value,
        to: Value,
    ) {
        let body = b.create_block();
        let exit = b.create_block();
        b.append_block_param(body, self.ptr);
        let empty = b.ins().icmp(IntCC::UnsignedGreaterThanOrEqual, from, to);
        b.ins().brif(empty, exit, &[], body, &[from.into()]);
        b.switch_to_block(body);
        let i = b.block_params(body)[0];
        let offset = b.ins().ishl_imm_u(i, 2);
        let at: Vec<Value> = self
            .args
            .iter()
            .map(|&arg| b.ins().iadd(arg, offset))
            .collect();
        let bytes = 4 * ty.lane_count() as i32;
        for copy in 0..copies as i32 {
            let mut values: Vec<Value> = Vec::with_capacity(self.g.nodes.len());
            for node in &self.g.nodes {
                let v = |k: usize| values[k];
                let value = match *node {
                    Node::Load(k) => b.ins().load(ty, MEM, at[k], copy * bytes),
                    Node::Scalar(k) => scalars[k],
                    Node::Neg(a) => b.ins().fneg(v(a)),
                    Node::Abs(a) => b.ins().fabs(v(a)),
                    Node::Sqrt(a) => b.ins().sqrt(v(a)),
                    Node::Add(x, y) => b.ins().fadd(v(x), v(y)),
                    Node::Sub(x, y) => b.ins().fsub(v(x), v(y)),
                    Node::Mul(x, y) => b.ins().fmul(v(x), v(y)),
                    Node::Div(x, y) => b.ins().fdiv(v(x), v(y)),
                    Node::Sum { first, count, mean } => {
                        let terms: Vec<Value> = (first..first + count).map(v).collect();
                        let mean = mean.map(|k| scalars[k]);
                        sum_in_f64(b, ty, &terms, mean)
                    }
                    Node::Select(c, x, y) => {
                        let zero = b.ins().f32const(0.0);
                        if ty.is_vector() {
                            let zero = b.ins().splat(ty, zero);
                            let mask = b.ins().fcmp(FloatCC::NotEqual, v(c), zero);
                            let mask = b.ins().bitcast(ty, MemFlagsData::new(), mask);
                            b.ins().bitselect(mask, v(x), v(y))
                        } else {
                            let cond = b.ins().fcmp(FloatCC::NotEqual, v(c), zero);
                            b.ins().select(cond, v(x), v(y))
                        }
                    }
                };
                values.push(value);
            }
            for (k, &node) in self.g.outputs.iter().enumerate() {
                let out = at[self.g.inputs + k];
                b.ins().store(MEM, values[node], out, copy * bytes);
            }
        }
        let next = b.ins().iadd_imm_u(i, i64::from(ty.lane_count() * copies));
        let more = b.ins().icmp(IntCC::UnsignedLessThan, next, to);
        b.ins().brif(more, body, &[next.into()], exit, &[]);
        b.switch_to_block(exit);
    }
}

/// Little-endian lane order: reinterpreting a vector as one of other lanes.
const LANES: MemFlagsData = MemFlagsData::new().with_endianness(Endianness::Little);

/// `terms` (f32 lanes of `ty`) summed in f64 in order, divided by `mean` (an f32 scalar
/// or vector of one value, exact in f64) if given, rounded once to f32. Vectors of four
/// f32 lanes widen to two vectors of two f64 lanes each, and narrow back.
fn sum_in_f64(b: &mut FunctionBuilder, ty: Type, terms: &[Value], mean: Option<Value>) -> Value {
    if !ty.is_vector() {
        let wide = |b: &mut FunctionBuilder, x| b.ins().fpromote(types::F64, x);
        let mut acc = wide(b, terms[0]);
        for &t in &terms[1..] {
            let t = wide(b, t);
            acc = b.ins().fadd(acc, t);
        }
        if let Some(q) = mean {
            let q = wide(b, q);
            acc = b.ins().fdiv(acc, q);
        }
        return b.ins().fdemote(types::F32, acc);
    }
    // Bytes 8..16 then 8..16 again: lanes 2 and 3 moved down (for the high half).
    let high: Vec<u8> = (8..16).chain(8..16).collect();
    let high = b.func.dfg.immediates.push(ConstantData::from(high));
    let halves = |b: &mut FunctionBuilder, x: Value| {
        let low = b.ins().fvpromote_low(x);
        let bytes = b.ins().bitcast(types::I8X16, LANES, x);
        let up = b.ins().shuffle(bytes, bytes, high);
        let up = b.ins().bitcast(types::F32X4, LANES, up);
        (low, b.ins().fvpromote_low(up))
    };
    let (mut low, mut up) = halves(b, terms[0]);
    for &t in &terms[1..] {
        let (l, u) = halves(b, t);
        low = b.ins().fadd(low, l);
        up = b.ins().fadd(up, u);
    }
    if let Some(q) = mean {
        // Every lane of `q` holds the same value: its low two widened are the divisor.
        let q = b.ins().fvpromote_low(q);
        low = b.ins().fdiv(low, q);
        up = b.ins().fdiv(up, q);
    }
    // Each narrows to two f32 lanes (the upper two zero); the low 8 bytes of each,
    // side by side, are the four results.
    let low = b.ins().fvdemote(low);
    let up = b.ins().fvdemote(up);
    let join: Vec<u8> = (0..8).chain(16..24).collect();
    let join = b.func.dfg.immediates.push(ConstantData::from(join));
    let low = b.ins().bitcast(types::I8X16, LANES, low);
    let up = b.ins().bitcast(types::I8X16, LANES, up);
    let joined = b.ins().shuffle(low, up, join);
    b.ins().bitcast(types::F32X4, LANES, joined)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::floats::every_kind;

    /// Element `i` of the graph, evaluated with Rust's f32 operations (those of the
    /// stage loops).
    fn eval(g: &Graph, inputs: &[Vec<f32>], scalars: &[f32], i: usize) -> Vec<f32> {
        let mut v: Vec<f32> = Vec::new();
        for node in &g.nodes {
            let x = match *node {
                Node::Load(k) => inputs[k][i],
                Node::Scalar(k) => scalars[k],
                Node::Neg(a) => -v[a],
                Node::Abs(a) => v[a].abs(),
                Node::Sqrt(a) => v[a].sqrt(),
                Node::Add(a, b) => v[a] + v[b],
                Node::Sub(a, b) => v[a] - v[b],
                Node::Mul(a, b) => v[a] * v[b],
                Node::Div(a, b) => v[a] / v[b],
                Node::Sum { first, count, mean } => {
                    let mut acc = f64::from(v[first]);
                    for &t in &v[first + 1..first + count] {
                        acc += f64::from(t);
                    }
                    if let Some(q) = mean {
                        acc /= f64::from(scalars[q]);
                    }
                    acc as f32
                }
                Node::Select(c, a, b) => {
                    if v[c] != 0.0 {
                        v[a]
                    } else {
                        v[b]
                    }
                }
            };
            v.push(x);
        }
        g.outputs.iter().map(|&o| v[o]).collect()
    }

    /// Every operation, chained so that each reads earlier results, compiled and run over
    /// lengths with and without a tail of single elements, gives the bits of Rust's f32
    /// operations (NaN for NaN: payloads may differ between instruction choices, as
    /// they do between the stage loops' and the interpreter's).
    #[test]
    fn compiled_graphs_compute_what_the_stage_loops_compute() {
        use Node::*;
        let g = Graph {
            nodes: vec![
                Load(0),
                Load(1),
                Scalar(0),
                Load(2),
                Add(0, 1),
                Sub(4, 2),
                Mul(5, 0),
                Div(6, 1),
                Sqrt(7),
                Neg(8),
                Abs(9),
                Select(3, 10, 5),
                Scalar(1),
                Div(11, 12),
                Mul(13, 2),
                Sum {
                    first: 4,
                    count: 3,
                    mean: Some(0),
                },
                Sum {
                    first: 14,
                    count: 2,
                    mean: None,
                },
            ],
            inputs: 3,
            scalars: 2,
            outputs: vec![16, 11, 0, 8],
        };
        let Some(code) = compile(&g) else {
            // No Cranelift backend for this host (or compilation turned off): nothing
            // to compare.
            assert!(
                cranelift_native::builder().is_err()
                    || std::env::var("COCONET_JIT").as_deref() == Ok("0")
            );
            return;
        };
        for n in [0, 1, 3, 4, 5, 8, 15, 16, 17, 20, 35, 1001] {
            let inputs: Vec<Vec<f32>> = (0..3).map(|k| every_kind(n, 7 + k)).collect();
            let scalars = [0.5f32, 3.0e-7];
            let mut outputs: Vec<Vec<f32>> = vec![vec![-1.0; n]; 3];
            // The last output updates input 0 in place, as an optimizer updates state.
            let mut in_place = inputs[0].clone();
            let mut pointers: Vec<*mut f32> = vec![
                in_place.as_mut_ptr(),
                inputs[1].as_ptr().cast_mut(),
                inputs[2].as_ptr().cast_mut(),
            ];
            pointers.extend(outputs.iter_mut().map(|o| o.as_mut_ptr()));
            pointers.push(in_place.as_mut_ptr());
            // SAFETY: every pointer holds n f32; the only shared one is input 0 and the
            // last output, the same elements.
            unsafe { code.run(&pointers, &scalars, n) };
            for i in 0..n {
                let want = eval(&g, &inputs, &scalars, i);
                let got = [outputs[0][i], outputs[1][i], outputs[2][i], in_place[i]];
                for (k, (w, x)) in want.iter().zip(got).enumerate() {
                    assert!(
                        w.to_bits() == x.to_bits() || (w.is_nan() && x.is_nan()),
                        "n = {n}, element {i}, output {k}: compiled {x:e}, Rust {w:e}"
                    );
                }
            }
        }
        // Compiled once: the same graph comes from the cache.
        let again = compile(&g).expect("compiled before");
        assert_eq!(again.entry as usize, code.entry as usize);
    }
}
