//! What the candle training examples (`train_digits`, `train_gpt`, `train_gpt_cuda`,
//! `tensor_parallel`, `mnist_conversion`) and their tests share, compiled once:
//! [`replicas`] (replicas of a model with one template's weights, deterministic initial
//! weights, comparing replicas and loss curves) and [`gpt`] (a character GPT on one
//! device and the same model tensor-parallel).

pub mod gpt;
pub mod replicas;
