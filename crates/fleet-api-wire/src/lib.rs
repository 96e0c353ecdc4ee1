//! fleet's v1 HTTP API as bytes on the wire, shared by the server (fleet-api) and fleetctl's
//! HTTP client (its API driver), so the two cannot drift: [`wire`] holds the entities with
//! fleet's JSON names and this API's extensions, [`convert`] turns fleet-ops' model into them
//! and back (an error body back into the [`fleet_ops::OpsError`] it stands for); [`import`]
//! holds the import plan's extension.
//!
//! It serves nothing and sends nothing: no HTTP, no I/O, only types and their conversions.

pub mod changes;
pub mod convert;
pub mod events;
pub mod import;
pub mod wire;
