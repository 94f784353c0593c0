//! The dense parameters' optimizer: the single worker's Adam as coconet's fused step.

/// The single worker's Adam ([`AdamConfig`](crate::train::AdamConfig)) as the
/// fused data-parallel step's AdamW: no weight decay, no clipping.
pub(super) fn dense_optimizer(adam: crate::train::AdamConfig) -> coconet_candle::AdamWConfig {
    coconet_candle::AdamWConfig {
        lr: adam.learning_rate,
        beta1: adam.beta1,
        beta2: adam.beta2,
        eps: adam.eps,
        weight_decay: 0.0,
        max_grad_norm: None,
    }
}
