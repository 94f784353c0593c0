//! Rental granularity: clouds rent some types only by whole instances (eight A100s in a
//! p4d.24xlarge), so "1 × A100 + 1 × H100" cannot be bought.
//!
//! Under [`Rental::Instances`] a plan rents, for each type `t` with
//! `units_per_instance = n_t`, the units `u_t` of all its stages together (and of the
//! parameter server's shards) rounded up to whole instances, `n_t · ⌈u_t / n_t⌉`, and
//! pays for all of them: several stages of one type share an instance (pipeline stages
//! on one 8-GPU box), the rest of the last instance is idle. A type's cap limits the
//! rented units, which is the same as limiting the used ones to `n_t · ⌊cap / n_t⌋`
//! (`usable_cap`), so the limits stay linear in the units. [`Rental::Units`] prices
//! every unit singly, the paper's model.
//!
//! The rounding couples the stages of a type, so the cost is no longer a sum over
//! stages. It is one once the free slots left in each type's last instance are known:
//! adding `k` units to a type with `f` free slots rents `⌈(k − f)⁺ / n⌉` more instances.
//! The exact DP keeps those free slots in its state (`Slots`): what a partial plan has
//! paid so far plus its free slots determine every completion's cost, and fewer paid
//! with as many free slots or more is never worse.

use crate::catalog::Catalog;

/// How a plan's units are rented and priced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Rental {
    /// Every unit singly at its per-unit price, whatever the catalogue's instance sizes:
    /// the paper's cost model.
    Units,
    /// Whole instances of each type's `units_per_instance`, idle units paid: what a
    /// cloud rents. The same as [`Rental::Units`] for a catalogue that declares no
    /// instance sizes.
    #[default]
    Instances,
}

/// What a plan rents of one type.
#[derive(Debug, Clone, PartialEq)]
pub struct Rented {
    /// The type.
    pub ty: usize,
    /// Units the plan's stages and parameter-server shards run on.
    pub used: u64,
    /// Units per instance (1 under [`Rental::Units`]).
    pub per_instance: u64,
    /// Instances rented.
    pub instances: u64,
    /// Units rented and paid, `instances · per_instance` (at least `used`).
    pub units: u64,
    /// Units paid that nothing runs on, `units − used`.
    pub idle: u64,
    /// Dollars per hour for the rented units.
    pub price_per_hour: f64,
}

impl Rental {
    /// Units per instance of type `t` under this setting.
    pub fn instance_size(self, catalog: &Catalog, t: usize) -> u64 {
        match self {
            Rental::Units => 1,
            Rental::Instances => catalog.types[t].units_per_instance.max(1),
        }
    }

    /// What running `used[t]` units of each type rents, for the types used.
    pub fn rent(self, catalog: &Catalog, used: &[u64]) -> Vec<Rented> {
        used.iter()
            .enumerate()
            .filter(|&(_, &u)| u > 0)
            .map(|(t, &u)| {
                let n = self.instance_size(catalog, t);
                let units = round_up(u, n);
                Rented {
                    ty: t,
                    used: u,
                    per_instance: n,
                    instances: units / n,
                    units,
                    idle: units - u,
                    price_per_hour: units as f64 * catalog.types[t].price_per_hour,
                }
            })
            .collect()
    }
}

/// `units` rounded up to whole instances of `size` (saturating).
pub(crate) fn round_up(units: u64, size: u64) -> u64 {
    units.div_ceil(size).saturating_mul(size)
}

/// The most units a plan may use of a type capped at `cap` rented units: the whole
/// instances that fit under the cap.
pub(crate) fn usable_cap(cap: u64, size: u64) -> u64 {
    cap / size * size
}

/// Adding `k` units to a type of instance `size` whose rented instances have `free` slots
/// left: the instances rented more, and the free slots after.
pub(crate) fn fill(free: u64, k: u64, size: u64) -> (u64, u64) {
    if k <= free {
        return (0, free - k);
    }
    let more = (k - free).div_ceil(size);
    (more, more.saturating_mul(size) - (k - free))
}

/// The types rented by instances of more than one unit, as the exact DP tracks them.
pub(crate) struct Slots {
    /// `(type, units per instance)` of each tracked type.
    pub types: Vec<(usize, u64)>,
    /// `slot[t]`: the position of type `t` in `types`, if tracked.
    pub slot: Vec<Option<usize>>,
    /// Free slots each tracked type starts with: what the parameter server's shards
    /// leave of their last instance.
    pub start: Vec<u64>,
}

impl Slots {
    /// The types of `catalog` rented by instances of more than one unit under
    /// `rental`; `shards` units of type `ps` are rented before any stage (the parameter
    /// server).
    pub fn new(catalog: &Catalog, rental: Rental, shards: Option<(usize, u64)>) -> Self {
        let t_n = catalog.types.len();
        let mut types = Vec::new();
        let mut slot = vec![None; t_n];
        let mut start = Vec::new();
        for (t, s) in slot.iter_mut().enumerate() {
            let n = rental.instance_size(catalog, t);
            if n > 1 {
                *s = Some(types.len());
                types.push((t, n));
                let used = shards.filter(|&(ty, _)| ty == t).map_or(0, |(_, k)| k);
                start.push(round_up(used, n) - used);
            }
        }
        Slots { types, slot, start }
    }

    /// No type tracked: every unit priced singly, on `t_n` types.
    pub fn none(t_n: usize) -> Self {
        Slots {
            types: Vec::new(),
            slot: vec![None; t_n],
            start: Vec::new(),
        }
    }

    /// Combinations of free slots there are: the product of the instance sizes
    /// (saturating).
    pub fn states(&self) -> usize {
        self.types
            .iter()
            .fold(1usize, |s, &(_, n)| s.saturating_mul(n as usize))
    }

    /// What the free slots the plan starts with cost at `prices` (the shards' idle units):
    /// the DP's cost counts every idle unit.
    pub fn start_cost(&self, prices: &[f64]) -> f64 {
        self.types
            .iter()
            .zip(&self.start)
            .map(|(&(t, _), &f)| prices[t] * f as f64)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filling_instances_rents_whole_ones() {
        assert_eq!(round_up(0, 8), 0);
        assert_eq!(round_up(5, 8), 8);
        assert_eq!(round_up(9, 8), 16);
        assert_eq!(round_up(u64::MAX, 8), u64::MAX);
        assert_eq!(usable_cap(130, 8), 128);
        assert_eq!(usable_cap(7, 8), 0);
        // 3 units into a fresh type: one instance, 5 free; 2 more fill two of them.
        assert_eq!(fill(0, 3, 8), (1, 5));
        assert_eq!(fill(5, 2, 8), (0, 3));
        // 4 more than the 3 free: one more instance, 7 free.
        assert_eq!(fill(3, 4, 8), (1, 7));
        assert_eq!(fill(0, 16, 8), (2, 0));
        assert_eq!(fill(0, 1, 1), (1, 0));
    }
}
