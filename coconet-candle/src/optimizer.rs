//! What the data-parallel trainer runs: a built-in optimizer (AdamW, SGD with momentum,
//! each with optional global-norm clipping) or a user's own `#[coconet]` program, all
//! reduced to one form — a program and the values of its scalar inputs.

use super::error::TrainError;
use coconet_core::{Dim, Layout, Op, Program, ValueId};
use coconet_programs as programs;
use std::collections::BTreeMap;

/// AdamW's hyper-parameters: candle-nn's `ParamsAdamW`, field for field (f64, the same
/// defaults), so swapping candle's optimizer for this one changes nothing but the speed.
/// The step computes in f32, each hyper-parameter rounded to f32 once.
#[derive(Debug, Clone, Copy)]
pub struct AdamWConfig {
    /// Learning rate.
    pub lr: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Denominator epsilon.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// Clip the averaged gradient to this global L2 norm first (torch's
    /// `clip_grad_norm_`); `None`: no clipping.
    pub max_grad_norm: Option<f64>,
}

impl Default for AdamWConfig {
    fn default() -> AdamWConfig {
        AdamWConfig {
            lr: 0.001,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            max_grad_norm: None,
        }
    }
}

/// SGD, with momentum as torch's `SGD` computes it (no dampening). The default is
/// candle-nn's `SGD`: no momentum, no weight decay.
#[derive(Debug, Clone, Copy)]
pub struct SgdConfig {
    /// Learning rate.
    pub lr: f64,
    /// Momentum factor (0: plain SGD, candle's).
    pub momentum: f64,
    /// L2 penalty added to the gradient.
    pub weight_decay: f64,
    /// Nesterov momentum.
    pub nesterov: bool,
    /// Clip the averaged gradient to this global L2 norm first; `None`: no clipping.
    pub max_grad_norm: Option<f64>,
}

impl Default for SgdConfig {
    fn default() -> SgdConfig {
        SgdConfig {
            lr: 0.01,
            momentum: 0.0,
            weight_decay: 0.0,
            nesterov: false,
            max_grad_norm: None,
        }
    }
}

/// A user's optimizer program and the values of its scalar inputs.
///
/// The program must follow the trainer's contract (checked when the trainer is made):
/// - `g`: the gradient, `Tensor<f32, Local, [N]>` (any one symbolic dim);
/// - `w`: the weights, `Tensor<f32, Replicated, [N]>`, updated by the program;
/// - every other tensor input: optimizer state, `Tensor<f32, Replicated, [N]>`, starting
///   at zero; the fused schedule shards it, so each rank holds 1/P of it;
/// - scalar inputs: a scalar named `step` is set by the trainer to the step number
///   (1, 2, …); every other one gets its value here (and may be changed between steps
///   with `DataParallel::set_scalar`).
#[derive(Debug, Clone)]
pub struct OptimizerProgram {
    program: Program,
    scalars: BTreeMap<String, f64>,
}

impl OptimizerProgram {
    /// A program (e.g. `my_optimizer().program().clone()` of a `#[coconet]` function).
    pub fn new(program: Program) -> OptimizerProgram {
        OptimizerProgram {
            program,
            scalars: BTreeMap::new(),
        }
    }

    /// Sets scalar input `name` to `value` (converted to the input's dtype).
    pub fn scalar(mut self, name: &str, value: f64) -> OptimizerProgram {
        self.scalars.insert(name.to_string(), value);
        self
    }

    /// The program.
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// The values given to its scalar inputs.
    pub fn scalars(&self) -> &BTreeMap<String, f64> {
        &self.scalars
    }
}

/// The optimizer a [`super::DataParallel`] trainer runs.
#[derive(Debug, Clone)]
pub enum Optimizer {
    /// AdamW (candle-nn's).
    AdamW(AdamWConfig),
    /// SGD with momentum (torch's).
    Sgd(SgdConfig),
    /// A user's program.
    Program(OptimizerProgram),
}

impl From<AdamWConfig> for Optimizer {
    fn from(c: AdamWConfig) -> Optimizer {
        Optimizer::AdamW(c)
    }
}

impl From<SgdConfig> for Optimizer {
    fn from(c: SgdConfig) -> Optimizer {
        Optimizer::Sgd(c)
    }
}

impl From<OptimizerProgram> for Optimizer {
    fn from(p: OptimizerProgram) -> Optimizer {
        Optimizer::Program(p)
    }
}

/// Refuses a hyper-parameter outside its range (NaN included): `what` of optimizer
/// `name`, which must satisfy `ok`, described by `range`.
fn check(name: &str, what: &str, x: f64, ok: bool, range: &str) -> Result<(), TrainError> {
    if ok && x.is_finite() {
        Ok(())
    } else {
        Err(TrainError::Mismatch(format!(
            "{name}: {what} is {x}; it must be {range}"
        )))
    }
}

impl Optimizer {
    /// Refuses hyper-parameters no step should run with: a learning rate, epsilon, weight
    /// decay or momentum that is negative or not finite, betas outside [0, 1), a
    /// clipping norm that is not positive.
    pub fn validate(&self) -> Result<(), TrainError> {
        let clip = |name: &str, max: Option<f64>| match max {
            Some(m) => check(name, "max_grad_norm", m, m > 0.0, "a finite number > 0"),
            None => Ok(()),
        };
        match *self {
            Optimizer::AdamW(c) => {
                let n = "AdamW";
                check(n, "lr", c.lr, c.lr >= 0.0, "a finite number ≥ 0")?;
                check(
                    n,
                    "beta1",
                    c.beta1,
                    (0.0..1.0).contains(&c.beta1),
                    "in [0, 1)",
                )?;
                check(
                    n,
                    "beta2",
                    c.beta2,
                    (0.0..1.0).contains(&c.beta2),
                    "in [0, 1)",
                )?;
                check(n, "eps", c.eps, c.eps >= 0.0, "a finite number ≥ 0")?;
                check(
                    n,
                    "weight_decay",
                    c.weight_decay,
                    c.weight_decay >= 0.0,
                    "a finite number ≥ 0",
                )?;
                clip(n, c.max_grad_norm)
            }
            Optimizer::Sgd(c) => {
                let n = "SGD";
                check(n, "lr", c.lr, c.lr >= 0.0, "a finite number ≥ 0")?;
                check(
                    n,
                    "momentum",
                    c.momentum,
                    c.momentum >= 0.0,
                    "a finite number ≥ 0",
                )?;
                check(
                    n,
                    "weight_decay",
                    c.weight_decay,
                    c.weight_decay >= 0.0,
                    "a finite number ≥ 0",
                )?;
                if c.nesterov && c.momentum == 0.0 {
                    return Err(TrainError::Mismatch(
                        "SGD: nesterov needs a momentum > 0 (as torch's SGD says)".into(),
                    ));
                }
                clip(n, c.max_grad_norm)
            }
            Optimizer::Program(ref p) => {
                for (name, &x) in p.scalars() {
                    check(p.program().name(), name, x, true, "finite")?;
                }
                Ok(())
            }
        }
    }

    /// The program and scalar values this optimizer runs.
    pub fn to_program(&self) -> OptimizerProgram {
        let f = |x: f64| x;
        match *self {
            Optimizer::AdamW(c) => {
                let program = match c.max_grad_norm {
                    None => programs::adamw().program().clone(),
                    Some(_) => programs::adamw_clipped().program().clone(),
                };
                let p = OptimizerProgram::new(program)
                    .scalar("lr", f(c.lr))
                    .scalar("beta1", f(c.beta1))
                    .scalar("beta2", f(c.beta2))
                    .scalar("eps", f(c.eps))
                    .scalar("weight_decay", f(c.weight_decay));
                clipped(p, c.max_grad_norm)
            }
            Optimizer::Sgd(c) => {
                let program = match c.max_grad_norm {
                    None => programs::sgd().program().clone(),
                    Some(_) => programs::sgd_clipped().program().clone(),
                };
                let p = OptimizerProgram::new(program)
                    .scalar("lr", f(c.lr))
                    .scalar("momentum", f(c.momentum))
                    .scalar("weight_decay", f(c.weight_decay))
                    .scalar("nesterov", if c.nesterov { 1.0 } else { 0.0 });
                clipped(p, c.max_grad_norm)
            }
            Optimizer::Program(ref p) => p.clone(),
        }
    }
}

/// A built-in program's `max_norm` scalar, where it clips.
fn clipped(p: OptimizerProgram, max_grad_norm: Option<f64>) -> OptimizerProgram {
    match max_grad_norm {
        Some(max) => p.scalar("max_norm", max),
        None => p,
    }
}

/// The parts of an optimizer program the trainer binds, found by checking the contract.
pub(crate) struct Contract {
    /// The name of the parameter-count dim.
    pub dim: String,
    /// The optimizer-state inputs (zero at the start).
    pub state: Vec<ValueId>,
    /// Scalar inputs other than `step`, with their values.
    pub scalars: Vec<(String, f64)>,
    /// Whether the program has a `step` scalar.
    pub has_step: bool,
}

impl OptimizerProgram {
    /// Checks the contract (see [`OptimizerProgram`]); the error names what is off.
    pub(crate) fn contract(&self) -> Result<Contract, TrainError> {
        let p = &self.program;
        let bad = |m: String| TrainError::Mismatch(format!("optimizer `{}`: {m}", p.name()));
        let tensor = |name: &str, layout: Layout| -> Result<(ValueId, String), TrainError> {
            let id = p
                .find(name)
                .filter(|&id| p.node(id).op == Op::TensorInput)
                .ok_or_else(|| bad(format!("has no tensor input `{name}`")))?;
            let ty = &p.node(id).ty;
            match (ty.dtype, ty.layout, ty.shape.0.as_slice()) {
                (coconet_core::DType::F32, l, [Dim::Sym(n)]) if l == layout => Ok((id, n.clone())),
                _ => Err(bad(format!(
                    "`{name}` is {:?} {:?} {}; the trainer needs f32 {layout:?} [N]",
                    ty.dtype, ty.layout, ty.shape
                ))),
            }
        };
        let (g, dim) = tensor("g", Layout::Local)?;
        let (w, w_dim) = tensor("w", Layout::Replicated)?;
        if w_dim != dim {
            return Err(bad(format!(
                "`w` is [{w_dim}] and `g` [{dim}]: they must agree"
            )));
        }
        if !p.updates().any(|(t, _)| t == w) {
            return Err(bad("never updates `w`".into()));
        }
        let mut state = Vec::new();
        let mut scalars = Vec::new();
        let mut has_step = false;
        for id in p.inputs() {
            let name = p.label(id);
            match p.node(id).op {
                Op::TensorInput if id == g || id == w => {}
                Op::TensorInput => {
                    let (s, d) = tensor(&name, Layout::Replicated)?;
                    if d != dim {
                        return Err(bad(format!("state `{name}` is [{d}], `g` is [{dim}]")));
                    }
                    state.push(s);
                }
                Op::ScalarInput if name == "step" => has_step = true,
                Op::ScalarInput => {
                    let v = self
                        .scalars
                        .get(&name)
                        .ok_or_else(|| bad(format!("no value given for scalar `{name}`")))?;
                    scalars.push((name, *v));
                }
                _ => {}
            }
        }
        for name in self.scalars.keys() {
            if !scalars.iter().any(|(n, _)| n == name) {
                return Err(bad(format!(
                    "a value is given for `{name}`, which is not one of its scalar inputs"
                )));
            }
        }
        Ok(Contract {
            dim,
            state,
            scalars,
            has_step,
        })
    }
}
