//! All-gathers that cross between hosts once per block (as NCCL's inter-node rings do):
//! where a job's ranks sit on several hosts, each a contiguous range of the same number
//! `g` of ranks, a rank sends its block to the ranks of its own host and to one rank of
//! every other host — its *counterpart*, of the same place on that host — which then
//! passes it on to its own host's ranks. A flat all-gather sends every block to every
//! rank of every other host: `g` times the bytes across the network.
//!
//! Only bytes move differently: every rank ends with the same blocks in the same places,
//! so results are bitwise those of the flat all-gather. (The reduce-scatter before it
//! keeps its all-to-all: the rank-order reduction cannot add a host's ranks first, except
//! for the host holding the first ranks, whose f64 partial sums only pay from three
//! ranks per host on; not done.)
//!
//! Each all-gather becomes two steps, both all-to-alls with parts only where bytes move:
//! [`Hosts::post_first`] (my block to my host and to my counterparts), then, once it is
//! done, [`Hosts::post_second`] once per other host (the block I received for my host,
//! from that host, on to my host's other ranks).

use super::transport::link::{Flight, Link, Parts};
use std::ops::Range;

/// The job's hosts, where the relay applies (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hosts {
    /// Ranks per host.
    g: usize,
    /// Hosts.
    h: usize,
}

impl Hosts {
    /// The hosts of `link`'s ranks, where there are at least two, each a contiguous range
    /// of the same number (at least two) of ranks; `None` otherwise (the flat all-gather
    /// then: alike on every process, which all see the same map).
    pub fn of(link: &dyn Link) -> Option<Hosts> {
        if std::env::var("COCONET_FLAT_GATHER").as_deref() == Ok("1") {
            return None;
        }
        let hosts = link.hosts();
        let world = hosts.len();
        let g = hosts.iter().take_while(|&&h| h == hosts[0]).count();
        if g < 2 || world <= g || !world.is_multiple_of(g) {
            return None;
        }
        // Host k holds ranks k·g .. (k + 1)·g, named by its first.
        let contiguous = hosts.iter().enumerate().all(|(r, &host)| host == r / g * g);
        contiguous.then_some(Hosts { g, h: world / g })
    }

    fn host(&self, r: usize) -> usize {
        r / self.g
    }

    /// The rank of host `host` that receives rank `s`'s block for that host.
    fn counterpart(&self, s: usize, host: usize) -> usize {
        host * self.g + s % self.g
    }

    /// The hosts other than `me`'s, in order.
    pub fn others(&self, me: usize) -> impl Iterator<Item = usize> + '_ {
        let mine = self.host(me);
        (0..self.h).filter(move |&k| k != mine)
    }

    /// Posts the first step of an all-gather: my `len` bytes at `send` to every rank of
    /// my host (me included) and to my counterpart on every other host; into `into` at
    /// `at(s)` (a byte range), rank s's bytes where s is on my host or I am its
    /// counterpart here.
    ///
    /// # Safety
    /// As for [`Link::post_all_to_all`]: `send..send + len` stays valid and unwritten,
    /// and every `into + at(s)` that receives valid and otherwise untouched, until the
    /// flight is dropped.
    pub unsafe fn post_first<'l>(
        &self,
        link: &'l dyn Link,
        me: usize,
        (send, len): (*const u8, usize),
        into: *mut u8,
        at: &dyn Fn(usize) -> Range<usize>,
    ) -> Box<dyn Flight + 'l> {
        let world = self.g * self.h;
        let mine = self.host(me);
        let to = |t: usize| self.host(t) == mine || t == self.counterpart(me, self.host(t));
        let from = |s: usize| self.host(s) == mine || me == self.counterpart(s, mine);
        let counts = (0..world).map(|t| if to(t) { len } else { 0 }).collect();
        let rc = (0..world)
            .map(|s| if from(s) { at(s).len() } else { 0 })
            .collect();
        let rd = (0..world)
            .map(|s| if from(s) { at(s).start } else { 0 })
            .collect();
        // SAFETY: the caller's contract; every send part is `send..send + len`.
        unsafe {
            link.post_all_to_all(
                Parts {
                    ptr: send.cast_mut(),
                    counts,
                    displs: vec![0; world],
                },
                Parts {
                    ptr: into,
                    counts: rc,
                    displs: rd,
                },
            )
        }
    }

    /// Posts the second step for host `from_host` (once the first is done): the block I
    /// received for my host from my counterpart there, read from `into` at its place, to
    /// my host's other ranks; each of their counterparts' blocks from them into `into`.
    ///
    /// # Safety
    /// As for [`Hosts::post_first`]; the first step's bytes have landed in `into`.
    pub unsafe fn post_second<'l>(
        &self,
        link: &'l dyn Link,
        me: usize,
        from_host: usize,
        into: *mut u8,
        at: &dyn Fn(usize) -> Range<usize>,
    ) -> Box<dyn Flight + 'l> {
        let world = self.g * self.h;
        let mine = self.host(me);
        let peer = |t: usize| self.host(t) == mine && t != me;
        // The rank of `from_host` whose block rank t of my host relays.
        let relayed = |t: usize| self.counterpart(t, from_host);
        let mut sc = vec![0; world];
        let mut sd = vec![0; world];
        let mut rc = vec![0; world];
        let mut rd = vec![0; world];
        for t in (0..world).filter(|&t| peer(t)) {
            let out = at(relayed(me));
            (sc[t], sd[t]) = (out.len(), out.start);
            let theirs = at(relayed(t));
            (rc[t], rd[t]) = (theirs.len(), theirs.start);
        }
        // SAFETY: the caller's contract; the parts sent (my counterpart's block) and
        // received (the other ranks' counterparts' blocks) are disjoint places of `into`.
        unsafe {
            link.post_all_to_all(
                Parts {
                    ptr: into,
                    counts: sc,
                    displs: sd,
                },
                Parts {
                    ptr: into,
                    counts: rc,
                    displs: rd,
                },
            )
        }
    }
}
