//! Typed handles to the values of a program, as the `#[coconet]` macro exposes them
//! (`p.g1`, `p.w`): a schedule or a test refers to a stage by a field, not by a string,
//! and the element type travels with the handle.

use crate::{Element, Operand, ValueId};
use std::marker::PhantomData;

macro_rules! handle {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name<T> {
            id: ValueId,
            _t: PhantomData<fn() -> T>,
        }

        impl<T: Element> $name<T> {
            /// Wraps a value id (the caller vouches for its dtype).
            pub fn from_id(id: ValueId) -> Self {
                $name { id, _t: PhantomData }
            }

            /// The value's id in the program.
            pub fn id(self) -> ValueId {
                self.id
            }
        }

        impl<T> Clone for $name<T> {
            fn clone(&self) -> Self {
                *self
            }
        }

        impl<T> Copy for $name<T> {}

        impl<T> From<$name<T>> for ValueId {
            fn from(h: $name<T>) -> ValueId {
                h.id
            }
        }

        impl<T> From<$name<T>> for Operand {
            fn from(h: $name<T>) -> Operand {
                Operand::Value(h.id)
            }
        }
    };
}

handle!(
    /// A tensor input of the program with element type `T`.
    TensorInput
);
handle!(
    /// A scalar input of the program with element type `T`.
    ScalarInput
);
handle!(
    /// A named stage (`let name = ...`) with element type `T`.
    Stage
);
