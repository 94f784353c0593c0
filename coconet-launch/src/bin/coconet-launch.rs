//! `coconet-launch`: starts a multi-process job's ranks on this node, torchrun-style
//! (see [`coconet_launch::cli`]).
//!
//! ```text
//! coconet-launch --nproc-per-node 4 -- ./my_training_binary --its-own-args
//! ```

fn main() {
    coconet_launch::cli::main();
}
