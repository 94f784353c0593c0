//! What tuning measured and chose.

use super::variant::Variant;
use coconet_core::Schedule;
use std::fmt;
use std::time::Duration;

/// The times of one contender.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    /// The schedule's name.
    pub schedule: String,
    /// Its position among the candidates given to [`tune`](crate::tune).
    pub schedule_index: usize,
    /// The knob variant's label.
    pub variant: String,
    /// Its position among the variants given to [`tune`](crate::tune).
    pub variant_index: usize,
    /// Median of the timed rounds.
    pub median: Duration,
    /// Fastest round.
    pub min: Duration,
    /// Slowest round.
    pub max: Duration,
    /// Memory per rank of the schedule ([`Schedule::footprint`], the busiest rank).
    pub bytes_per_rank: u64,
}

/// What [`tune`](crate::tune) found.
#[derive(Debug, Clone)]
pub struct Tuning {
    /// The fastest contender whose results equal the program's.
    pub best: Measurement,
    /// Every contender that was timed, fastest first.
    pub table: Vec<Measurement>,
    /// Contenders left out, and why (e.g. their results differ from the program's).
    pub rejected: Vec<(String, String)>,
    /// Whether the choice came from the cache (then nothing was run, and `table` is
    /// the table measured when it was made).
    pub from_cache: bool,
    /// What the caller should know: a cache that could not be read or written, timing
    /// one contender after another for lack of memory.
    pub notes: Vec<String>,
}

impl Tuning {
    /// The chosen schedule among `candidates` (those given to [`tune`](crate::tune)).
    pub fn schedule<'a>(&self, candidates: &'a [Schedule]) -> Option<&'a Schedule> {
        candidates
            .get(self.best.schedule_index)
            .filter(|s| s.name() == self.best.schedule)
    }

    /// The chosen variant among `variants` (those given to [`tune`](crate::tune)).
    pub fn variant<'a, B>(&self, variants: &'a [Variant<B>]) -> Option<&'a Variant<B>> {
        variants
            .get(self.best.variant_index)
            .filter(|v| v.label == self.best.variant)
    }
}

impl fmt::Display for Tuning {
    /// The table: schedule × variant → median (min–max), memory per rank, the choice
    /// marked; then the rejected contenders and the notes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let width = self
            .table
            .iter()
            .map(|m| m.schedule.len() + m.variant.len() + 2)
            .max()
            .unwrap_or(0)
            .max(9);
        writeln!(
            f,
            "  {:<width$}  {:>10}  {:>19}  {:>9}  {:>7}",
            "schedule", "median ms", "min–max ms", "MiB/rank", "÷ best"
        )?;
        for m in &self.table {
            let name = format!("{}, {}", m.schedule, m.variant);
            let mark = if *m == self.best { "*" } else { " " };
            writeln!(
                f,
                "{mark} {name:<width$}  {:>10.3}  {:>8.3} – {:<8.3}  {:>9.1}  {:>7.2}",
                ms(m.median),
                ms(m.min),
                ms(m.max),
                m.bytes_per_rank as f64 / (1u64 << 20) as f64,
                ms(m.median) / ms(self.best.median),
            )?;
        }
        for (who, why) in &self.rejected {
            writeln!(f, "  rejected {who}: {why}")?;
        }
        if self.from_cache {
            writeln!(f, "  (from the cache: nothing was run)")?;
        }
        for n in &self.notes {
            writeln!(f, "  note: {n}")?;
        }
        Ok(())
    }
}
