//! Chrome trace-event JSON of a run (open it in Perfetto or chrome://tracing): one row
//! per rank, one slice per step, so overlap and load imbalance are visible.

use super::exec::Span;
use serde_json::{Value, json};

/// The trace of one run: `spans[rank]` are that rank's steps.
pub fn to_json(spans: &[Vec<Span>]) -> String {
    let mut events: Vec<Value> = Vec::new();
    for (rank, steps) in spans.iter().enumerate() {
        events.push(json!({
            "name": "thread_name", "ph": "M", "pid": 0, "tid": rank,
            "args": { "name": format!("rank {rank}") }
        }));
        for s in steps {
            events.push(json!({
                "name": s.name, "ph": "X", "pid": 0, "tid": rank,
                "ts": s.start_us, "dur": s.dur_us
            }));
        }
    }
    json!({ "traceEvents": events, "displayTimeUnit": "ms" }).to_string()
}
