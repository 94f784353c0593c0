//! `as_slice`: store a Replicated input sliced (optimizer state at 1/P memory), once
//! `reorder` has left it used only through its slices.

use super::error::ScheduleError;
use super::rewrite::{Rewrite, users};
use super::scheduled::Schedule;
use crate::Collective;
use crate::{Layout, Op, Program, ValueId};
use std::collections::{BTreeSet, HashMap};

const T: &str = "as_slice";

impl Schedule {
    /// Stores each tensor input in `tensors` Sliced instead of Replicated. Precondition:
    /// the input is read only through `scatter(t, d)` (one `d` for all uses) and, if it
    /// is updated, the update writes `all_gather(e)` of a slice `e` and nothing reads the
    /// updated value. The scatters become the input itself, the update writes `e`
    /// directly, and the all-gathers that become dead are removed.
    pub fn as_slice(&mut self, tensors: &[ValueId]) -> Result<(), ScheduleError> {
        self.before_annotations(T)?;
        let p = &self.program;
        let users = users(p);
        // Input -> its sliced dim; nodes that disappear -> what replaces them.
        let mut dims: HashMap<ValueId, usize> = HashMap::new();
        let mut dropped: BTreeSet<ValueId> = BTreeSet::new();
        for &t in tensors {
            let t = self.stage(T, t)?;
            let d = self.slice_dim(&users, t, &mut dropped)?;
            dims.insert(t, d);
        }
        let program = sliced(p, &dims, &dropped)?;
        let names: Vec<String> = tensors.iter().map(|&t| p.label(t)).collect();
        self.replace(program, format!("as_slice([{}])", names.join(", ")));
        Ok(())
    }

    /// The dim the Replicated tensor input `t` is read sliced along (0 where nothing
    /// reads it), once every use is checked to read it through that dim's slices; the
    /// nodes that disappear with it (its scatters, a gather only its update reads) go
    /// into `dropped`.
    fn slice_dim(
        &self,
        users: &HashMap<ValueId, Vec<ValueId>>,
        t: ValueId,
        dropped: &mut BTreeSet<ValueId>,
    ) -> Result<usize, ScheduleError> {
        let p = &self.program;
        let node = p.node(t);
        if node.op != Op::TensorInput || node.ty.layout != Layout::Replicated {
            return Err(ScheduleError::new(
                T,
                format!(
                    "{} is not a Replicated tensor input ({} {})",
                    self.label(t),
                    node.op.name(),
                    node.ty.layout
                ),
            ));
        }
        let mut dim = None;
        let mut agree = |d: usize, what: &str| -> Result<(), ScheduleError> {
            match dim {
                Some(old) if old != d => Err(ScheduleError::new(
                    T,
                    format!(
                        "{} is used sliced along dim {old} and along dim {d} ({what})",
                        self.label(t)
                    ),
                )),
                _ => {
                    dim = Some(d);
                    Ok(())
                }
            }
        };
        for &u in users.get(&t).map(Vec::as_slice).unwrap_or_default() {
            match p.node(u).op {
                Op::Scatter(_, d) => {
                    agree(d, "a scatter")?;
                    dropped.insert(u);
                }
                Op::Update { target, value } if target == t => {
                    let d = self.gathered_update(users, t, u, value)?;
                    agree(d, "its update")?;
                    if users[&value].len() == 1 && !p.outputs().contains(&value) {
                        dropped.insert(value);
                    }
                }
                ref op => {
                    return Err(ScheduleError::new(
                        T,
                        format!(
                            "{} is read whole by {} ({}); only inputs read through their \
                             slices can be stored sliced (reorder its users first)",
                            self.label(t),
                            self.label(u),
                            op.name()
                        ),
                    ));
                }
            }
        }
        let d = dim.unwrap_or(0);
        if d >= node.ty.shape.rank() {
            return Err(ScheduleError::new(
                T,
                format!("{} is a scalar tensor and cannot be sliced", self.label(t)),
            ));
        }
        Ok(d)
    }

    /// The dim of the slice whose all-gather `value` the update `u` of `t` writes, where
    /// it is one and nothing reads the updated value (which must otherwise stay
    /// Replicated).
    fn gathered_update(
        &self,
        users: &HashMap<ValueId, Vec<ValueId>>,
        t: ValueId,
        u: ValueId,
        value: ValueId,
    ) -> Result<usize, ScheduleError> {
        let p = &self.program;
        let gathered = match p.node(value).op {
            Op::Collective(Collective::AllGather, e) => match p.node(e).ty.layout {
                Layout::Sliced(d) => Some(d),
                _ => None,
            },
            _ => None,
        };
        let Some(d) = gathered else {
            return Err(ScheduleError::new(
                T,
                format!(
                    "{} is updated with {}, which is not an all_gather of a slice \
                     (reorder the update first)",
                    self.label(t),
                    self.label(value)
                ),
            ));
        };
        if users.get(&u).is_some_and(|v| !v.is_empty()) || p.outputs().contains(&u) {
            return Err(ScheduleError::new(
                T,
                format!(
                    "the updated value {} is read afterwards, so it must stay \
                     Replicated",
                    self.label(u)
                ),
            ));
        }
        Ok(d)
    }
}

/// `p` with each input of `dims` stored Sliced along its dim: its scatters (in
/// `dropped`) become the input itself, its update writes the gathered slice directly,
/// and the gathers in `dropped` are gone.
fn sliced(
    p: &Program,
    dims: &HashMap<ValueId, usize>,
    dropped: &BTreeSet<ValueId>,
) -> Result<Program, ScheduleError> {
    let mut rw = Rewrite::new(p);
    let check = |e| ScheduleError::check(T, e);
    for id in p.ids() {
        let node = p.node(id);
        if let Some(&d) = dims.get(&id) {
            let group = match node.ty.placement {
                crate::Placement::Group(g) => g,
                crate::Placement::Everywhere => 0,
            };
            rw.b.reuse_id(id).map_err(check)?;
            let name = p.label(id);
            let new =
                rw.b.tensor_input(
                    &name,
                    node.ty.dtype,
                    Layout::Sliced(d),
                    node.ty.shape.clone(),
                    group,
                )
                .map_err(check)?;
            rw.map.insert(id, new);
        } else if dropped.contains(&id) {
            // A scatter of a now-sliced input is the input; a dead gather is gone.
            if let Op::Scatter(t, _) = node.op {
                let v = rw.get(t);
                rw.map.insert(id, v);
            }
        } else if let Op::Update { target, value } = node.op
            && dims.contains_key(&target)
        {
            let Op::Collective(Collective::AllGather, e) = p.node(value).op else {
                unreachable!("checked above")
            };
            let (t, e) = (rw.get(target), rw.get(e));
            rw.copy_with(id, |o| {
                if o == target {
                    t
                } else if o == value {
                    e
                } else {
                    o
                }
            })
            .map_err(check)?;
        } else {
            rw.copy(id).map_err(check)?;
        }
    }
    rw.finish().map_err(check)
}
