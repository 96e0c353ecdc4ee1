//! Functional cluster harness.
