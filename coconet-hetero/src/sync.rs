//! How a stage's data-parallel replicas synchronise their dense parameters after each
//! batch, and what that costs per byte of parameters with `k` replicas.
//!
//! The paper's model ([`SyncModel::Ring`]) charges a ring all-reduce over the type's
//! network, `2(k−1)/k · G / bw`, and nothing for the optimizer update. A real step is an
//! all-reduce *and* an update, and coconet can run them as several schedules — all-reduce
//! then the update on every replica (AR-C), reduce-scatter, the update on a 1/k shard,
//! all-gather (RS-C-AG), or those fused into one pass (fuse(RS-C-AG)).
//! [`SyncModel::Schedules`] prices every such schedule from its traffic and takes the
//! cheapest, as coconet's autotuner would; `coconet::hetero_sync::coconet_schedules`
//! derives the traffic from coconet's own plans and cost model.
//!
//! [`SyncModel::AsyncServer`] is the asynchronous parameter-server mode Paddle's HeterPS
//! trains in: the dense parameters live on the parameter server beside the sparse
//! tables, and each replica pushes its gradients and pulls the parameters in the
//! background without waiting for the others. A stage then spends nothing on
//! synchronisation; the server holds the dense parameters and serves `2·G` bytes per
//! batch (see [`crate::cost`]'s parameter server), the same for every plan at a given
//! throughput. Replicas train on parameters a few steps stale, which can cost
//! convergence; the model does not price that.

/// Bytes per byte of the stage's dense parameters, as a function of the replica count:
/// `fixed + per_replica / k` (every term of coconet's schedules has this form: a ring's
/// `2(k−1)/k` is `2 − 2/k`, an update on a 1/k shard is `c/k`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Traffic {
    /// The part independent of `k`.
    pub fixed: f64,
    /// The part divided by `k`.
    pub per_replica: f64,
}

impl Traffic {
    /// Bytes per parameter byte at `k` replicas (never negative).
    pub fn at(&self, k: u64) -> f64 {
        (self.fixed + self.per_replica / k as f64).max(0.0)
    }
}

/// One step of a synchronisation schedule, on one replica: bytes through its memory and
/// over its network per parameter byte. The two overlap (a GPU's copy and compute
/// engines, a fused kernel's pipelined chunks): the step takes the longer.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SyncStep {
    /// Through the replica's memory.
    pub memory: Traffic,
    /// Sent over the replica's network.
    pub network: Traffic,
}

/// A synchronisation schedule: its steps, one after another.
#[derive(Debug, Clone, PartialEq)]
pub struct SyncSchedule {
    /// Its name (coconet's: `AR-C`, `RS-C-AG`, `fuse(RS-C-AG)`).
    pub name: String,
    /// Its steps with `k ≥ 2` replicas.
    pub steps: Vec<SyncStep>,
    /// Bytes through memory per parameter byte with one replica (the update alone:
    /// there is nothing to all-reduce, so the steps' form does not apply).
    pub alone: f64,
}

impl SyncSchedule {
    /// Seconds per parameter byte at `k` replicas on a unit with `memory` and `network`
    /// bytes/s.
    pub fn seconds_per_byte(&self, k: u64, memory: f64, network: f64) -> f64 {
        if k <= 1 {
            return self.alone / memory;
        }
        self.steps
            .iter()
            .map(|s| (s.memory.at(k) / memory).max(s.network.at(k) / network))
            .sum()
    }
}

/// A stretch of replica counts on which a schedule's seconds per parameter byte are
/// `a + b·u` in `u = 1/k`: `u` from `u_lo` to `u_hi`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Piece {
    /// Smallest `u` (largest `k`) of the stretch.
    pub u_lo: f64,
    /// Largest `u` (smallest `k`) of the stretch.
    pub u_hi: f64,
    /// The constant part.
    pub a: f64,
    /// The part times `u = 1/k`.
    pub b: f64,
}

impl SyncSchedule {
    /// The schedule's seconds per parameter byte for `k ≥ 2` (`u = 1/k ≤ 1/2`) down to
    /// `u = u_min`, as affine pieces in `u`. Each step takes the largest of three affine
    /// functions of `u` (nothing, memory, network), so the pieces break where two of
    /// them cross; between breaks the sum is affine.
    pub fn pieces(&self, memory: f64, network: f64, u_min: f64) -> Vec<Piece> {
        let lines = |st: &SyncStep| {
            [
                (0.0, 0.0),
                (st.memory.fixed / memory, st.memory.per_replica / memory),
                (st.network.fixed / network, st.network.per_replica / network),
            ]
        };
        let mut breaks = vec![u_min, 0.5];
        for st in &self.steps {
            let l = lines(st);
            for i in 0..3 {
                for j in i + 1..3 {
                    let (di, dj) = (l[i].1 - l[j].1, l[j].0 - l[i].0);
                    if di != 0.0 {
                        let u = dj / di;
                        if u > u_min && u < 0.5 {
                            breaks.push(u);
                        }
                    }
                }
            }
        }
        breaks.sort_by(f64::total_cmp);
        breaks.dedup();
        breaks
            .windows(2)
            .map(|w| {
                let mid = 0.5 * (w[0] + w[1]);
                let (mut a, mut b) = (0.0, 0.0);
                for st in &self.steps {
                    let (la, lb) = lines(st)
                        .into_iter()
                        .max_by(|x, y| (x.0 + x.1 * mid).total_cmp(&(y.0 + y.1 * mid)))
                        .unwrap_or((0.0, 0.0));
                    a += la;
                    b += lb;
                }
                Piece {
                    u_lo: w[0],
                    u_hi: w[1],
                    a,
                    b,
                }
            })
            .collect()
    }
}

/// How the planner prices a stage's synchronisation.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum SyncModel {
    /// The paper's: a ring all-reduce of the dense parameters, the update free.
    #[default]
    Ring,
    /// The cheapest of these schedules at each replica count (the update included).
    Schedules(Vec<SyncSchedule>),
    /// No synchronisation in the stage: every replica pushes and pulls the dense
    /// parameters through the parameter server, asynchronously (see the module docs).
    AsyncServer,
}

impl SyncModel {
    /// Seconds per parameter byte at `k` replicas on a unit with `memory` and `network`
    /// bytes/s, and the schedule that takes them (`None` for the ring).
    pub fn seconds_per_byte(&self, k: u64, memory: f64, network: f64) -> (f64, Option<&str>) {
        match self {
            SyncModel::Ring => {
                let kf = k as f64;
                (2.0 * (kf - 1.0) / kf / network, None)
            }
            SyncModel::AsyncServer => (0.0, Some("async parameter server")),
            SyncModel::Schedules(list) => list
                .iter()
                .map(|s| {
                    (
                        s.seconds_per_byte(k, memory, network),
                        Some(s.name.as_str()),
                    )
                })
                .min_by(|a, b| a.0.total_cmp(&b.0))
                .unwrap_or((0.0, None)),
        }
    }
}

/// An update of 7 bytes per byte on every replica after a ring (`AR-C`), against the
/// update on a 1/k shard overlapped with the ring (`fused`): Adam's shape, for tests.
#[cfg(test)]
pub(crate) fn adam_like() -> SyncModel {
    let ring = Traffic {
        fixed: 2.0,
        per_replica: -2.0,
    };
    SyncModel::Schedules(vec![
        SyncSchedule {
            name: "AR-C".into(),
            alone: 7.0,
            steps: vec![
                SyncStep {
                    memory: Traffic::default(),
                    network: ring,
                },
                SyncStep {
                    memory: Traffic {
                        fixed: 7.0,
                        per_replica: 0.0,
                    },
                    network: Traffic::default(),
                },
            ],
        },
        SyncSchedule {
            name: "fused".into(),
            alone: 7.0,
            steps: vec![SyncStep {
                memory: Traffic {
                    fixed: 2.0,
                    per_replica: 5.0,
                },
                network: ring,
            }],
        },
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_schedule_is_the_papers_formula() {
        let ring = SyncSchedule {
            name: "ring".into(),
            steps: vec![SyncStep {
                memory: Traffic::default(),
                network: Traffic {
                    fixed: 2.0,
                    per_replica: -2.0,
                },
            }],
            alone: 0.0,
        };
        let model = SyncModel::Schedules(vec![ring]);
        for k in [1, 2, 3, 8, 1000] {
            let (a, _) = model.seconds_per_byte(k, 1e12, 1e9);
            let (b, _) = SyncModel::Ring.seconds_per_byte(k, 1e12, 1e9);
            assert!((a - b).abs() < 1e-21, "{k}: {a} vs {b}");
        }
    }

    #[test]
    fn the_cheapest_schedule_is_taken_and_its_pieces_are_exact() {
        let model = adam_like();
        let (mem, net) = (1e10, 1e10);
        // k = 4: AR-C 1.5/net + 7/mem = 8.5e-10; fused max(3.25, 1.5)e-10.
        let (t, name) = model.seconds_per_byte(4, mem, net);
        assert_eq!(name, Some("fused"));
        assert!((t - 3.25e-10).abs() < 1e-22, "{t}");
        // The pieces are the schedules' costs for every k ≥ 2.
        let SyncModel::Schedules(list) = &model else {
            unreachable!()
        };
        for s in list {
            let pieces = s.pieces(mem, net, 1e-6);
            for k in 2..200u64 {
                let u = 1.0 / k as f64;
                let p = pieces.iter().find(|p| p.u_lo <= u && u <= p.u_hi).unwrap();
                let want = s.seconds_per_byte(k, mem, net);
                assert!(((p.a + p.b * u) - want).abs() < 1e-22, "{} at {k}", s.name);
            }
        }
    }
}
