//! fleet's v1 entities and this API's extensions: they live in [`fleet_api_wire::wire`], shared
//! with fleetctl's HTTP client; re-exported here under the name the handlers use.

pub use fleet_api_wire::wire::*;
