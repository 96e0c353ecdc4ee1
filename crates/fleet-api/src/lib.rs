//! fleet's v1 HTTP API, as fleet's clients know it: fleet's paths (under `/fleet/v1` and the
//! legacy `/v1-alpha`), entities and JSON names, status codes, error entity and page tokens.
//! docs/api.md lists every route and where this API is deliberately not fleet's.
//!
//! [`routes::router`] builds the service over any [`fleet_registry::kv::Kv`]; every registry
//! call goes through [`ops`]. [`serve::serve`] runs it on a listener. Listeners, their
//! permissions and socket activation belong to fleetd.

pub mod authz;
pub mod discovery;
pub mod entity;
pub mod error;
mod group;
mod head;
pub mod health;
pub mod held;
pub mod inspect;
mod maintenance;
pub mod metrics;
pub mod ops;
pub mod page;
pub mod routes;
pub mod serve;
mod shape;

pub use error::{ApiError, ETCD_UNREACHABLE};
pub use inspect::{InspectError, Inspector};
pub use metrics::Metrics;
pub use page::{PageError, PageToken};
pub use routes::{Api, PREFIXES, router};
pub use serve::{Listener, serve};

/// fleet's default page size (`token_limit`).
pub const DEFAULT_TOKEN_LIMIT: u16 = 100;

#[cfg(test)]
mod tests;
