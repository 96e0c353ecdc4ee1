//! fleet's v1 entities and this API's extensions: they live in [`fleet_ops::wire`], shared
//! with fleetctl's HTTP client; re-exported here under the name the handlers use.

pub use fleet_ops::wire::*;
