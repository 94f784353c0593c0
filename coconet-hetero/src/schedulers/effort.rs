//! How far the exact search may go: a budget of work, a wall-time cap and a stop flag
//! ([`SearchConfig::work_limit`], [`SearchConfig::time_limit`], [`SearchConfig::stop`]),
//! shared by every phase of one run of [`super::Dp`] — the DP passes, Lagrangian pricing,
//! the coarse table, the label search, the lower bounds and, under the paper's
//! objective, every throughput step.
//!
//! **Work** is counted in units that do not depend on the machine, each worth about the
//! same time (~5 ns here): one per stage a DP pass evaluates (times the usage states of a
//! table pass), 20 per stage provisioned, 20 per stage a completion bound reads, 20 per
//! label the search under caps makes and 3 per comparison between labels, 30 per stage
//! a tail bound prices. From 10^8 to 2.5·10^8 units take a second on the 2-core VM the
//! benchmarks ran on, by problem. The same problem with the same work limit always stops
//! at the same point with the same plan, bound and status; the wall-time cap is the only
//! limit whose effect depends on the machine and its load.
//!
//! **When a limit stops the search.** The work is checked between DP passes (a pass is
//! never cut short: every bound it gives holds) and every 4096 labels. The work limit and
//! the wall-time cap stop the search once it has a plan to return — the phases that find
//! the first plan within every limit are bounded by their own budgets
//! ([`super::Dp::max_pricing_work`], [`super::Dp::max_table_work`]) — and a stop request
//! (a signal) stops it at once, with its best plan if it has one.

use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::scheduler::{SearchConfig, StopFlag};

/// Why a search stopped short.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Ended {
    /// The work limit: the same for every run of the same problem and settings.
    Work(u64),
    /// The wall-time cap, in seconds.
    Time(f64),
    /// A stop request, with the flag's value (a signal's number from the CLI).
    Stopped(usize),
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ended::Work(_) => write!(f, "the work limit ran out"),
            Ended::Time(_) => write!(f, "the time limit passed"),
            Ended::Stopped(2) => write!(f, "interrupted (SIGINT)"),
            Ended::Stopped(15) => write!(f, "interrupted (SIGTERM)"),
            Ended::Stopped(n) => write!(f, "interrupted (stop request {n})"),
        }
    }
}

/// Units of work per label the search under caps makes (a usage vector allocated and
/// its front scanned).
pub(crate) const LABEL_WORK: u64 = 20;
/// Comparisons between two labels per 3 units of work.
pub(crate) const COMPARISON_WORK: u64 = 3;
/// Units of work per stage a lower bound prices (provisioned afresh each time).
pub(crate) const BOUND_STAGE_WORK: u64 = 30;
/// Units of work per stage provisioned into the store of a DP's stages.
pub(crate) const PROVISION_WORK: u64 = 20;
/// Units of work per stage a completion bound (a backward DP) reads.
pub(crate) const COMPLETION_WORK: u64 = 20;

/// The limits of one run and what it has spent (see the module docs).
pub(crate) struct Effort {
    work_limit: Option<u64>,
    time_limit: Option<f64>,
    used: Cell<u64>,
    deadline: Option<Instant>,
    stop: Option<StopFlag>,
    ended: Cell<Option<Ended>>,
    /// The share of the work left that each label search may spend (see
    /// [`Effort::share_labels`]), and the work at which the current one stops.
    label_share: Cell<Option<f64>>,
    label_until: Cell<Option<u64>>,
}

impl Effort {
    /// The limits of `config`, the wall time counted from now.
    pub fn new(config: &SearchConfig) -> Self {
        Effort {
            work_limit: config.work_limit,
            time_limit: config.time_limit.map(|t| t.as_secs_f64()),
            used: Cell::new(0),
            deadline: config
                .time_limit
                .and_then(|t| Instant::now().checked_add(t)),
            stop: config.stop.clone(),
            ended: Cell::new(None),
            label_share: Cell::new(None),
            label_until: Cell::new(None),
        }
    }

    /// From now on each label search (`dp_labels`) may spend at most `share` of the work
    /// left when it starts, where there is a work limit: the paper's objective solves a
    /// DP per throughput, and a label search that does not close within its share is
    /// better left for the bounds that prove the other throughputs (`parametric`).
    pub fn share_labels(&self, share: f64) {
        self.label_share.set(Some(share));
    }

    /// A label search starts: its stop, at its share of the work left (if any).
    pub fn start_labels(&self) {
        let until = self
            .label_share
            .get()
            .zip(self.work_limit)
            .map(|(share, limit)| {
                let left = limit.saturating_sub(self.used.get());
                self.used.get().saturating_add((share * left as f64) as u64)
            });
        self.label_until.set(until);
    }

    /// Whether the label search must end: the run has ended ([`Effort::ended`]), or it
    /// spent its share of the work.
    pub fn labels_ended(&self) -> bool {
        self.ended().is_some() || self.labels_spent()
    }

    /// Whether the label search spent its share of the work (the run itself may go on).
    pub fn labels_spent(&self) -> bool {
        self.label_until.get().is_some_and(|u| self.used.get() >= u)
    }

    /// Counts `units` of work done.
    pub fn spend(&self, units: u64) {
        self.used.set(self.used.get().saturating_add(units));
    }

    /// Units of work done so far.
    pub fn used(&self) -> u64 {
        self.used.get()
    }

    /// Whether a stop was requested (and if so, from now on, why the search ended).
    pub fn interrupted(&self) -> Option<Ended> {
        if let Some(Ended::Stopped(n)) = self.ended.get() {
            return Some(Ended::Stopped(n));
        }
        let n = self.stop.as_ref()?.load(Ordering::Relaxed);
        (n != 0).then(|| {
            let why = Ended::Stopped(n);
            self.ended.set(Some(why));
            why
        })
    }

    /// Why the search must end now, if it must: a stop request, the work spent past the
    /// work limit, or the wall-time cap passed. Once a limit is reached it stays
    /// reached (the first one reached is the reason).
    pub fn ended(&self) -> Option<Ended> {
        if let Some(why) = self.interrupted() {
            return Some(why);
        }
        if let Some(why) = self.ended.get() {
            return Some(why);
        }
        let why = if self.work_limit.is_some_and(|w| self.used.get() >= w) {
            Ended::Work(self.work_limit.unwrap_or(0))
        } else if self.deadline.is_some_and(|d| Instant::now() >= d) {
            Ended::Time(self.time_limit.unwrap_or(0.0))
        } else {
            return None;
        };
        self.ended.set(Some(why));
        Some(why)
    }

    /// The limits, for messages: "N units of work or S s".
    pub fn describe(&self) -> String {
        match (self.work_limit, self.time_limit) {
            (Some(w), Some(t)) => format!("{w} units of work or {t} s"),
            (Some(w), None) => format!("{w} units of work"),
            (None, Some(t)) => format!("{t} s"),
            (None, None) => "no limit".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_work_limit_ends_a_search_once_spent_and_for_good() {
        let effort = Effort::new(&SearchConfig {
            work_limit: Some(10),
            time_limit: None,
            ..SearchConfig::default()
        });
        assert_eq!(effort.ended(), None);
        effort.spend(9);
        assert_eq!(effort.ended(), None);
        effort.spend(1);
        assert_eq!(effort.ended(), Some(Ended::Work(10)));
        assert_eq!(effort.used(), 10);
        assert_eq!(effort.ended(), Some(Ended::Work(10)));
        assert_eq!(effort.interrupted(), None);
    }

    #[test]
    fn a_stop_request_ends_a_search_and_is_named() {
        let flag = StopFlag::default();
        let effort = Effort::new(&SearchConfig {
            work_limit: Some(10),
            time_limit: Some(Duration::from_secs(3600)),
            stop: Some(flag.clone()),
            ..SearchConfig::default()
        });
        assert_eq!(effort.ended(), None);
        flag.store(2, Ordering::Relaxed);
        assert_eq!(effort.interrupted(), Some(Ended::Stopped(2)));
        assert_eq!(effort.ended(), Some(Ended::Stopped(2)));
        assert_eq!(Ended::Stopped(2).to_string(), "interrupted (SIGINT)");
        assert_eq!(Ended::Stopped(15).to_string(), "interrupted (SIGTERM)");
    }

    /// A label search given a share of the work left stops there, the run going on; the
    /// next one gets its share of what is left then.
    #[test]
    fn a_label_search_stops_at_its_share_of_the_work_left() {
        let effort = Effort::new(&SearchConfig {
            work_limit: Some(1000),
            time_limit: None,
            ..SearchConfig::default()
        });
        effort.start_labels();
        effort.spend(900);
        assert!(!effort.labels_ended(), "no share: the run's limit alone");
        effort.share_labels(0.5);
        effort.start_labels();
        effort.spend(49);
        assert!(!effort.labels_ended());
        effort.spend(1);
        assert!(effort.labels_spent() && effort.labels_ended());
        assert_eq!(effort.ended(), None);
        effort.start_labels();
        assert!(!effort.labels_ended());
        effort.spend(25);
        assert!(effort.labels_ended());
    }

    #[test]
    fn a_zero_time_limit_ends_a_search_at_once() {
        let effort = Effort::new(&SearchConfig {
            work_limit: None,
            time_limit: Some(Duration::ZERO),
            ..SearchConfig::default()
        });
        assert_eq!(effort.ended(), Some(Ended::Time(0.0)));
    }
}
