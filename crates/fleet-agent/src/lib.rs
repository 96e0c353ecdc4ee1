//! Placeholder; see the crate's description.
