//! Adam for the dense layers, with its state in the open so a checkpoint can save it
//! (candle-nn's `AdamW` keeps its moments private). The arithmetic is candle-nn's
//! `AdamW` with no weight decay, operation for operation, so the two agree bit for bit.

use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};

/// Adam's hyperparameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamConfig {
    /// Step size.
    pub learning_rate: f64,
    /// Decay of the first moment.
    pub beta1: f64,
    /// Decay of the second moment.
    pub beta2: f64,
    /// Added to the root of the second moment.
    pub eps: f64,
}

impl Default for AdamConfig {
    /// PaddleRec's CTR-DNN: learning rate 0.001; torch's betas and eps.
    fn default() -> Self {
        AdamConfig {
            learning_rate: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        }
    }
}

/// Adam over a list of variables.
#[derive(Debug)]
pub struct Adam {
    config: AdamConfig,
    vars: Vec<Var>,
    /// First and second moments, one pair per variable.
    moments: Vec<(Var, Var)>,
    /// Steps taken (the bias correction's `t`).
    steps: u64,
}

impl Adam {
    /// Adam with zero moments over `vars`.
    pub fn new(vars: Vec<Var>, config: AdamConfig) -> candle_core::Result<Adam> {
        let moments = vars
            .iter()
            .map(|v| {
                let zeros = || Var::zeros(v.shape(), v.dtype(), v.device());
                Ok((zeros()?, zeros()?))
            })
            .collect::<candle_core::Result<_>>()?;
        Ok(Adam {
            config,
            vars,
            moments,
            steps: 0,
        })
    }

    /// Updates every variable that has a gradient in `grads`.
    pub fn step(&mut self, grads: &GradStore) -> candle_core::Result<()> {
        self.steps += 1;
        let AdamConfig {
            learning_rate: lr,
            beta1,
            beta2,
            eps,
        } = self.config;
        let t = i32::try_from(self.steps).unwrap_or(i32::MAX);
        let scale_m = 1.0 / (1.0 - beta1.powi(t));
        let scale_v = 1.0 / (1.0 - beta2.powi(t));
        for (theta, (m, v)) in self.vars.iter().zip(&self.moments) {
            let Some(g) = grads.get(theta) else { continue };
            let next_m = ((m.as_tensor() * beta1)? + (g * (1.0 - beta1))?)?;
            let next_v = ((v.as_tensor() * beta2)? + (g.sqr()? * (1.0 - beta2))?)?;
            let adjusted = ((&next_m * scale_m)? / ((&next_v * scale_v)?.sqrt()? + eps)?)?;
            let next_theta = (theta.as_tensor() - (adjusted * lr)?)?;
            m.set(&next_m)?;
            v.set(&next_v)?;
            theta.set(&next_theta)?;
        }
        Ok(())
    }

    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The moments `(m, v)` of every variable, in the variables' order.
    pub fn moments(&self) -> &[(Var, Var)] {
        &self.moments
    }

    /// Sets the state from a checkpoint: `moments` must match the variables' shapes.
    pub fn restore(&mut self, steps: u64, moments: &[(Tensor, Tensor)]) -> candle_core::Result<()> {
        if moments.len() != self.moments.len() {
            candle_core::bail!(
                "the checkpoint has Adam moments for {} variables, the model has {}",
                moments.len(),
                self.moments.len()
            );
        }
        for ((m, v), (cm, cv)) in self.moments.iter().zip(moments) {
            if m.shape() != cm.shape() || v.shape() != cv.shape() {
                candle_core::bail!(
                    "the checkpoint's Adam moments have shape {:?}, the variable {:?}",
                    cm.shape(),
                    m.shape()
                );
            }
        }
        for ((m, v), (cm, cv)) in self.moments.iter().zip(moments) {
            m.set(cm)?;
            v.set(cv)?;
        }
        self.steps = steps;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};
    use candle_nn::{AdamW, Optimizer, ParamsAdamW};

    #[test]
    fn agrees_with_candle_nn_adamw_without_decay_bit_for_bit() {
        let dev = Device::Cpu;
        let init: Vec<f32> = (0..12).map(|i| (i as f32 * 0.37).sin()).collect();
        let (a, b) = (
            Var::from_vec(init.clone(), (3, 4), &dev).unwrap(),
            Var::from_vec(init, (3, 4), &dev).unwrap(),
        );
        let mut ours = Adam::new(vec![a.clone()], AdamConfig::default()).unwrap();
        let mut theirs = AdamW::new(
            vec![b.clone()],
            ParamsAdamW {
                lr: 1e-3,
                weight_decay: 0.0,
                ..ParamsAdamW::default()
            },
        )
        .unwrap();
        for step in 0..5 {
            let target = Tensor::full(step as f32, (3, 4), &dev).unwrap();
            let loss_a = (a.as_tensor() - &target)
                .unwrap()
                .sqr()
                .unwrap()
                .sum_all()
                .unwrap();
            let loss_b = (b.as_tensor() - &target)
                .unwrap()
                .sqr()
                .unwrap()
                .sum_all()
                .unwrap();
            ours.step(&loss_a.backward().unwrap()).unwrap();
            theirs.step(&loss_b.backward().unwrap()).unwrap();
            let (x, y) = (
                a.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                b.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            );
            assert_eq!(x, y, "step {step}");
        }
        assert_eq!(ours.steps(), 5);
    }
}
