//! The paper's objective ([`Objective::Duration`]: cost = price · N / X at the plan's own
//! throughput X) solved with the required-rate DP as an oracle.
//!
//! Let `D(X)` be the cheapest price per hour of any plan provisioned for throughput `X`
//! (what the DP minimises at `X_req = X`). `D` never falls as `X` grows, and the best
//! plan under the paper's objective, reaching `X*`, costs `N·D(X*)/X*` — no less, since
//! its own price is at least `D(X*)`, and no more, since the DP's plan for `X*` reaches
//! at least `X*`. So the optimum is `min over X ≥ X_req of N·D(X)/X`, and as `D` is a
//! step function, only the right ends of its steps matter: the throughputs the DP's
//! plans reach. The search runs the DP at `X_req`, notes the throughput `X₁` its plan
//! reaches (every `X` up to `X₁` has the same `D`), and starts again just above `X₁` —
//! or further: a plan reaching `X` costs at least `N·D/X`, so every `X` below
//! `N·D/best` is skipped. Each step moves the search's *frontier*: every plan whose
//! throughput is below it costs at least `best`.
//!
//! **Beyond the frontier** `a`, every plan costs at least the tail bound `N·E(a)` of
//! `duration_bound` (each stage at least its price per sample at the fewest units that
//! reach `a`, with its synchronisation at that count, transfers included, or those
//! units spread over the most throughput the caps allow any plan; see there for why
//! that holds for every plan and every term of the cost model). So
//! `min(best, N·E(a))` bounds the optimum, and `E` never falls as `a` grows: after each
//! step the search computes it at the new frontier (one DP pass without limits or
//! usage states: about one step's cost where a step is one pass, a fraction of one
//! where caps or whole instances add states) and stops, proven, once `best` is within
//! a relative 1e-9 of it.
//! That tolerance is the skip's own: the search steps to `X₁·(1 + 1e-9)`, and a plan
//! between costs at least `best / (1 + 1e-9)`. The compute-only floor (each layer on its
//! cheapest type per sample) is a weaker bound of the same kind, kept as a fallback.
//!
//! **Pieces.** Where the DP's plans are not proven (large problems under caps: the label
//! search stops at the limits), the frontier would stay where the doubt began, and the
//! tail bound there prices each stage at its least time per sample — no rounding to
//! whole units — which leaves a gap of several per cent under binding caps. So the
//! frontier then moves by pieces of throughput `[a, b]`, each bounded on its own by
//! `duration_bound` with each stage's fewest units at `a` spread over `b`: the rounding
//! counted to within `b / a`. The least of the pieces' bounds (`covered`) joins the
//! bound. A piece starts 1 % wide, doubles (up to 32 %) while no plan in it beats the
//! best, and halves where its bound falls short of the best; pieces continue while each
//! raises the bound over the tail bound it replaces and the limits allow. The pieces
//! follow one another up the throughputs, so the bound keeps every stage's fewest units
//! from one to the next and re-prices only the stages whose units change
//! (`duration_bound::Memo`), and each step's label search may spend only a share of the
//! work left (`LABEL_SHARE`): where it does not close, that work moves the frontier
//! instead. On the planners bench's chain with two binding caps at the default limits
//! the stated gap falls from 5.96 % to 1.56 % at 10,000 layers and from 5.24 % to 0.65 %
//! at 3,000; at 1,000 layers every step closes, proven.
//!
//! The search also stops, proven, when no plan is feasible any more (caps). A search
//! that stops short — at its time limit, its step budget, or an inner DP undecided —
//! states its gap to `max(floor, min(best, N·E(frontier)))`. An inner DP that is not
//! proven optimal freezes the frontier where it started (its plan's price need not be
//! `D`), so only the tail bound from there on can still prove the answer.
//!
//! With a billing minimum `m` the cost is `D(X) · max(N/X, m)`: the skip still holds
//! (`max(N/X, m) ≥ N/X`), as does the tail bound, and once `N/X ≤ m` every further plan
//! costs `D · m` with `D` not falling, so the search stops there, proven.

use super::dp::Dp;
use super::duration_bound;
use super::effort::Effort;
use super::scheduler::{Optimality, Outcome, SearchConfig};

use crate::constraint::Constraint;
use crate::cost::Problem;
use crate::error::PlanError;
use crate::objective::Objective;

/// Dollars per sample no plan can beat: each layer's compute on the type that does it
/// cheapest (and holds it), no transfers, no synchronisation, no rounding of units.
pub(crate) fn floor_per_sample(pb: &Problem) -> f64 {
    (0..pb.num_layers())
        .map(|l| {
            (0..pb.num_types())
                .filter(|&t| pb.segment_memory(l, l, t) <= pb.catalog.types[t].memory_bytes)
                .map(|t| pb.price_per_second(t) * pb.segment_compute(l, l, t) / pb.batch_size(t))
                .fold(f64::INFINITY, f64::min)
        })
        .sum()
}

/// Width of the pieces of throughput that move the frontier where the DP's plans are not
/// proven, relative to where each starts: a piece `[a, b]` is bounded with each stage's
/// fewest units at `a` spread over `b` (`duration_bound`), which counts the rounding of
/// its units to within this.
const PIECE: f64 = 0.01;

/// The widest piece, relative to where it starts: pieces whose plans all cost more than
/// the best widen up to it.
const PIECE_MAX: f64 = 0.32;

/// The share of the work left that each throughput step's label search may spend: one
/// that does not close within it rarely closes at all on a problem that large, and the
/// work is better spent on the pieces, which bound every throughput and not one.
const LABEL_SHARE: f64 = 0.125;

/// Pieces between computations of the tail bound.
const TAIL_EVERY: usize = 3;

/// Relative tolerance within which a cost at its lower bound is proven optimal.
const PROOF_TOLERANCE: f64 = 1e-9;

/// Why the search ended.
enum End {
    /// Every throughput is accounted for: no plan reaches the next one, every further
    /// plan is billed its minimum, the floor is met, or the tail bound is.
    Complete,
    /// Stopped short, for this reason.
    Short(String),
}

/// The cheapest plan under [`Objective::Duration`] (see the module docs).
pub(super) fn solve(
    dp: &Dp,
    pb: &Problem,
    config: &SearchConfig,
    effort: &Effort,
) -> Result<Outcome, PlanError> {
    let samples = pb.constraint.samples;
    let floor = samples * floor_per_sample(pb);
    // No plan runs faster: what the tail bound spreads each stage's fewest units over.
    let top = duration_bound::max_throughput(pb);
    // What the bounds keep from one to the next: the stages' fewest units and the
    // limits' multipliers, each computation starting from the last one's.
    let memo = std::cell::RefCell::new(duration_bound::Memo::new(dp.split_runs));
    let bound_within = |a: f64, b: f64| samples * memo.borrow_mut().per_sample(pb, a, b, effort);
    let tail_from = |a: f64| bound_within(a, top);
    let oracle = pb.clone().with_objective(Objective::RequiredRate);
    effort.share_labels(LABEL_SHARE);
    let mut x = pb.constraint.throughput;
    let mut best: Option<Outcome> = None;
    let mut doubt: Option<String> = None;
    // Every plan whose throughput is below `frontier` costs at least `best`; `tail`: the
    // tail bound there, once computed.
    let mut frontier = x;
    let mut tail: Option<f64> = None;
    // Where unproven steps leave the frontier, pieces of throughput `[a, a·(1 + PIECE)]`
    // move it, each bounded on its own: every plan below the frontier costs at least
    // `best` or `covered`, the least of the pieces' bounds.
    let mut covered = f64::INFINITY;
    let mut width = PIECE;
    let (mut steps, mut evaluations) = (0usize, 0usize);
    let end = loop {
        // Past the work or time limit with a plan in hand, or asked to stop: no further
        // throughput step (each is a whole DP), the best so far with its gap.
        if let Some(why) = best.as_ref().and_then(|_| effort.ended()) {
            break End::Short(format!(
                "{why} after {steps} throughput steps ({:.3e} units of work)",
                effort.used() as f64
            ));
        }
        let at = Constraint::new(x, samples)
            .map_err(|e| PlanError::Backend(format!("dp: internal error, {e}")))?;
        let inner = match dp.required_rate_by(&oracle.with_constraint(at), config, effort) {
            Ok(o) => o,
            // Nothing reaches `x` (proven): nothing reaches more either; the search is
            // complete.
            Err(PlanError::NoFeasiblePlan(_)) if best.is_some() => break End::Complete,
            // Undecided at `x`: the best so far, with its gap.
            Err(PlanError::Undecided { reason, .. }) if best.is_some() => {
                break End::Short(format!(
                    "the DP at {} samples/s: {reason}",
                    crate::constraint::rate(x)
                ));
            }
            Err(e) => return Err(e),
        };
        evaluations += inner.evaluations;
        if let Optimality::NotGuaranteed(why) = &inner.optimality {
            doubt.get_or_insert_with(|| {
                format!("the DP at {} samples/s: {why}", crate::constraint::rate(x))
            });
        }
        let evaluation = pb
            .with_constraint(at)
            .evaluate(&inner.plan)
            .map_err(|e| PlanError::Backend(format!("dp: internal error, {e}")))?;
        let (price, reached) = (evaluation.price_per_hour, evaluation.throughput);
        keep_better(&mut best, inner.plan, evaluation, config);
        let best_cost = best.as_ref().map_or(f64::INFINITY, |b| b.evaluation.cost);
        if best_cost <= floor * (1.0 + 1e-12) {
            break End::Complete;
        }
        // From here on every plan finishes within the billing minimum, so each costs its
        // price times the minimum, and the price D never falls as X grows.
        if pb.catalog.billing_minimum > 0.0 && samples / x <= pb.catalog.billing_minimum {
            break End::Complete;
        }
        steps += 1;
        // Past this plan's throughput, and past every X where price·N/X ≥ best.
        x = (reached * (1.0 + 1e-9)).max(price / 3600.0 * samples / best_cost);
        if !x.is_finite() {
            break End::Complete;
        }
        // An unproven step's price need not be D(x): the frontier stays where it began.
        if doubt.is_none() && x > frontier {
            frontier = x;
            tail = None;
        }
        // (Where the DP's plans are unproven the pieces come first: the tail bound where
        // the doubt began is far below them.)
        let mut beyond = match (tail, &doubt) {
            (Some(t), _) => t,
            (None, Some(_)) => 0.0,
            (None, None) => *tail.insert(tail_from(frontier)),
        };
        // The DP's plans unproven, the frontier moves by pieces while each piece's bound
        // is above the tail bound it replaces (it then raises the least of them); the
        // tail bound is computed again every few pieces (and at the end).
        let mut pieces = 0;
        while doubt.is_some() && best_cost > beyond * (1.0 + PROOF_TOLERANCE) {
            if effort.ended().is_some() {
                break;
            }
            let upto = frontier * (1.0 + width);
            let piece = bound_within(frontier, upto);
            if piece <= beyond {
                break;
            }
            // Wider where no plan of the piece beats the best, narrower where its bound
            // falls short of the best by more than a tenth of the piece's width.
            if piece >= best_cost {
                width = (width * 2.0).min(PIECE_MAX);
            } else if piece < best_cost / (1.0 + 0.1 * width) {
                width = (width * 0.5).max(PIECE);
            }
            (covered, frontier, pieces) = (covered.min(piece), upto, pieces + 1);
            tail = None;
            if pieces % TAIL_EVERY == 0 {
                beyond = tail_from(frontier);
                tail = Some(beyond);
            }
        }
        if best_cost <= beyond.min(covered) * (1.0 + PROOF_TOLERANCE) {
            break End::Complete;
        }
        if steps >= dp.max_throughputs {
            break End::Short(format!(
                "searched {steps} throughputs up to {} samples/s",
                crate::constraint::rate(reached)
            ));
        }
    };
    let mut out = best.expect("the loop returns or finds a plan first");
    out.evaluations = evaluations;
    let cost = out.evaluation.cost;
    // What is proven: the whole range of throughputs without doubt, or below the
    // frontier, and the tail bound beyond it; the floor always.
    let bound = match (&end, &doubt) {
        (End::Complete, None) => cost,
        _ => {
            let beyond = tail.unwrap_or_else(|| tail_from(frontier));
            floor.max(beyond.min(covered).min(cost))
        }
    };
    (out.optimality, out.lower_bound) = verdict(cost, bound, end, doubt);
    Ok(out)
}

/// `plan` (evaluated as `evaluation`) as `best` if it is the first plan or costs less,
/// told to the caller's `found` (`--progress`).
fn keep_better(
    best: &mut Option<Outcome>,
    plan: crate::plan::SchedulingPlan,
    evaluation: crate::Evaluation,
    config: &SearchConfig,
) {
    if best
        .as_ref()
        .is_some_and(|b| evaluation.cost >= b.evaluation.cost)
    {
        return;
    }
    let better = best.insert(Outcome {
        scheduler: "dp".into(),
        plan,
        evaluation,
        evaluations: 0,
        optimality: Optimality::Proven,
        lower_bound: None,
    });
    if let Some(found) = &config.found {
        found(better);
    }
}

/// Whether a plan of `cost` is proven optimal by the lower `bound` the search ended
/// with (`end`, `doubt`), and the bound: proven, or the gap to the bound and why.
fn verdict(cost: f64, bound: f64, end: End, doubt: Option<String>) -> (Optimality, Option<f64>) {
    if cost <= bound * (1.0 + PROOF_TOLERANCE) {
        return (Optimality::Proven, Some(cost));
    }
    let gap = format!(
        "within {:.2} % of a lower bound",
        (cost / bound - 1.0) * 100.0
    );
    let why = match (end, doubt) {
        (End::Short(why), _) => format!("{why}; {gap}"),
        (End::Complete, Some(doubt)) => format!("{gap}; {doubt}"),
        // (A complete search without doubt is its own bound: only a cost that is not a
        // number gets here.)
        (End::Complete, None) => gap,
    };
    (Optimality::NotGuaranteed(why), Some(bound))
}
