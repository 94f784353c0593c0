//! Symbolic shapes: dimensions are either named symbols bound at run time (`N`, `B`, `H`) or
//! constants. Two symbolic dims are equal only when their names are equal.

use std::collections::BTreeMap;
use std::fmt;

/// One dimension of a tensor shape.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dim {
    /// A size named in the signature and bound at run time (e.g. `N`).
    Sym(String),
    /// A size fixed in the program.
    Const(usize),
}

impl Dim {
    /// A symbolic dimension.
    pub fn sym(name: impl Into<String>) -> Dim {
        Dim::Sym(name.into())
    }

    /// The size of this dim given the run-time bindings of symbols.
    pub fn resolve(&self, dims: &BTreeMap<String, usize>) -> Option<usize> {
        match self {
            Dim::Const(c) => Some(*c),
            Dim::Sym(s) => dims.get(s).copied(),
        }
    }

    fn is_one(&self) -> bool {
        *self == Dim::Const(1)
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Sym(s) => f.write_str(s),
            Dim::Const(c) => write!(f, "{c}"),
        }
    }
}

/// The logical (global) shape of a value; empty for scalars.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Shape(pub Vec<Dim>);

impl Shape {
    /// A shape from its dims.
    pub fn new(dims: Vec<Dim>) -> Shape {
        Shape(dims)
    }

    /// The shape of a scalar.
    pub fn scalar() -> Shape {
        Shape(Vec::new())
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// Whether this is a scalar (rank 0).
    pub fn is_scalar(&self) -> bool {
        self.0.is_empty()
    }

    /// Numpy-style broadcast of two shapes (aligned from the trailing dim; a dim broadcasts
    /// if it is the constant 1). Returns the index (from the right) of the first
    /// incompatible dim on failure.
    pub fn broadcast(&self, other: &Shape) -> Result<Shape, usize> {
        let n = self.rank().max(other.rank());
        let mut out = vec![Dim::Const(1); n];
        for i in 0..n {
            let a = self.from_right(i);
            let b = other.from_right(i);
            out[n - 1 - i] = match (a, b) {
                (Some(a), None) => a.clone(),
                (None, Some(b)) => b.clone(),
                (Some(a), Some(b)) if a == b => a.clone(),
                (Some(a), Some(b)) if a.is_one() => b.clone(),
                (Some(a), Some(b)) if b.is_one() => a.clone(),
                _ => return Err(i),
            };
        }
        Ok(Shape(out))
    }

    /// The dim `i` places from the right (0 = last), if any.
    pub fn from_right(&self, i: usize) -> Option<&Dim> {
        self.rank().checked_sub(i + 1).map(|k| &self.0[k])
    }

    /// Resolves every dim; `Err(name)` names the first unbound symbol.
    pub fn resolve(&self, dims: &BTreeMap<String, usize>) -> Result<Vec<usize>, String> {
        self.0
            .iter()
            .map(|d| d.resolve(dims).ok_or_else(|| d.to_string()))
            .collect()
    }

    /// The symbolic names used by this shape.
    pub fn symbols(&self) -> impl Iterator<Item = &str> {
        self.0.iter().filter_map(|d| match d {
            Dim::Sym(s) => Some(s.as_str()),
            Dim::Const(_) => None,
        })
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(dims: &[&str]) -> Shape {
        Shape(
            dims.iter()
                .map(|d| match d.parse::<usize>() {
                    Ok(c) => Dim::Const(c),
                    Err(_) => Dim::sym(*d),
                })
                .collect(),
        )
    }

    #[test]
    fn broadcast_trailing_dims() {
        assert_eq!(
            s(&["B", "S", "H"]).broadcast(&s(&["H"])),
            Ok(s(&["B", "S", "H"]))
        );
        assert_eq!(s(&["N"]).broadcast(&Shape::scalar()), Ok(s(&["N"])));
        assert_eq!(s(&["B", "1"]).broadcast(&s(&["H"])), Ok(s(&["B", "H"])));
        assert_eq!(s(&["N"]).broadcast(&s(&["M"])), Err(0));
        assert_eq!(s(&["N", "4"]).broadcast(&s(&["M", "4"])), Err(1));
    }

    #[test]
    fn resolve_names_unbound_symbol() {
        let mut dims = BTreeMap::new();
        dims.insert("B".to_string(), 2);
        assert_eq!(s(&["B", "3"]).resolve(&dims), Ok(vec![2, 3]));
        assert_eq!(s(&["B", "H"]).resolve(&dims), Err("H".to_string()));
    }
}
