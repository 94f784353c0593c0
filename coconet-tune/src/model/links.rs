//! The α–β time of a collective over links: per protocol (latency against bandwidth)
//! and per algorithm (ring, tree, in-network), the fastest — the choice NCCL's tuner
//! makes, in a simpler model of it (one bandwidth per protocol; NCCL also caps LL's
//! bandwidth and models multi-node plateaus).

use serde::{Deserialize, Serialize};

/// The links between ranks whose peers' memory is not their own (GPUs).
///
/// A ring spanning several nodes enters and leaves each node once per channel, over
/// every network adapter of the node, so its bus bandwidth is the smaller of a rank's
/// bandwidth inside the node and the node's adapters together
/// (`ranks_per_node · inter_beta`) — nccl-tests' multi-node busbw.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Links {
    /// Ranks per node.
    pub ranks_per_node: usize,
    /// Bandwidth a rank's collectives reach inside a node (B/s; nccl-tests' busbw).
    pub intra_beta: f64,
    /// One rank's share of its node's network bandwidth (B/s).
    pub inter_beta: f64,
    /// The protocols the collective library chooses from; each collective of each
    /// size takes the fastest protocol and algorithm.
    pub protocols: Vec<Protocol>,
    /// An in-network all-reduce inside one node (NVLink SHARP on NVSwitch); `None`
    /// where the switch cannot reduce.
    #[serde(default)]
    pub in_network: Option<InNetwork>,
}

/// An all-reduce the switch computes: every rank sends its tensor once and receives
/// the sum once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InNetwork {
    /// Algorithm bandwidth: bytes of the tensor per second.
    pub bandwidth: f64,
    /// Fixed latency (s).
    pub latency: f64,
}

/// One protocol: the share of the link bandwidth it reaches and its latencies per
/// algorithm.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Protocol {
    /// A name for tables (NCCL: LL, LL128, Simple).
    pub name: String,
    /// Share of the link bandwidth the protocol reaches (LL sends a flag with every
    /// 4 bytes of data: 0.5).
    pub efficiency: f64,
    /// Latencies of a ring.
    pub ring: Latency,
    /// Latencies of a tree (NCCL: a chain inside each node, a double binary tree
    /// between nodes: 2·⌊log₂ nodes⌋ network hops, as NCCL counts them, instead of a
    /// ring's 2·(nodes − 1));
    /// `None`: all-reduces run as rings only. Only plain all-reduces use it.
    #[serde(default)]
    pub tree: Option<Latency>,
}

/// Latencies of one algorithm under one protocol (s).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// Fixed latency of a collective.
    pub base: f64,
    /// One hop inside a node.
    pub intra_hop: f64,
    /// One hop between nodes.
    pub inter_hop: f64,
}

/// What one step sends over the links.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Transfer {
    /// Bytes the busiest rank sends (in a ring, an all-reduce of S bytes: 2(q−1)/q·S).
    pub bytes: f64,
    /// Hops one after another in a ring (an all-reduce: 2(q−1); a reduce-scatter or
    /// all-gather: q−1; a send: 1).
    pub hops: f64,
    /// How the bytes travel.
    pub pattern: Pattern,
}

/// How a collective's bytes travel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Pattern {
    /// Around a ring of the group (reduce-scatter, all-gather, a fused all-reduce).
    #[default]
    Ring,
    /// A plain all-reduce: a ring, a tree, or in the network.
    AllReduce,
    /// Each rank to its peer of the next pipeline group.
    Send,
}

impl Links {
    /// Seconds of `t` among the `q` ranks of a group (groups laid out over consecutive
    /// ranks of the `ranks` a plan spans), and the algorithm and protocol that take
    /// them.
    pub fn seconds(&self, q: usize, ranks: usize, t: &Transfer) -> (f64, String) {
        if t.bytes <= 0.0 {
            return (0.0, String::new());
        }
        let per_node = self.ranks_per_node.max(1);
        if t.pattern == Pattern::Send {
            // Every rank sends to its own peer at once: one hop, over the network
            // wherever the plan spans several nodes (each rank on its own adapter).
            let across = ranks > per_node;
            let beta = if across {
                self.inter_beta
            } else {
                self.intra_beta
            };
            let mut best = (f64::INFINITY, String::new());
            for p in &self.protocols {
                let hop = if across {
                    p.ring.inter_hop
                } else {
                    p.ring.intra_hop
                };
                let time = p.ring.base + hop + t.bytes / (beta * p.efficiency);
                if time < best.0 {
                    best = (time, format!("send/{}", p.name));
                }
            }
            return best;
        }
        if q < 2 {
            return (0.0, String::new());
        }
        let nodes = q.div_ceil(per_node);
        let beta = if nodes > 1 {
            self.intra_beta.min(self.inter_beta * per_node as f64)
        } else {
            self.intra_beta
        };
        let qf = q as f64;
        // Of a ring's q − 1 steps, nodes − 1 cross between nodes (NCCL's count).
        let inter_share = (nodes - 1) as f64 / (qf - 1.0);
        let mut best = (f64::INFINITY, String::new());
        let mut consider = |time: f64, name: String| {
            if time < best.0 {
                best = (time, name);
            }
        };
        for p in &self.protocols {
            let bw = beta * p.efficiency;
            let r = &p.ring;
            let hop = (1.0 - inter_share) * r.intra_hop + inter_share * r.inter_hop;
            consider(
                r.base + t.hops * hop + t.bytes / bw,
                format!("ring/{}", p.name),
            );
            if let (Some(tr), Pattern::AllReduce, true) = (&p.tree, t.pattern, q > 2) {
                // Up and down the tree: the whole tensor (q/(2(q−1)) of the ring's
                // volume) each way.
                let depth = (per_node.min(q) - 1) as f64 * tr.intra_hop
                    + (nodes as f64).log2().floor() * tr.inter_hop;
                let volume = t.bytes * qf / (qf - 1.0);
                consider(
                    tr.base + 2.0 * depth + volume / bw,
                    format!("tree/{}", p.name),
                );
            }
        }
        if let (Some(n), Pattern::AllReduce, 1) = (&self.in_network, t.pattern, nodes) {
            let size = t.bytes * qf / (2.0 * (qf - 1.0));
            consider(n.latency + size / n.bandwidth, "in-network".into());
        }
        best
    }
}
