//! `fleetctl ui`: where the dashboard is (issue 42). Every fleetd serves it under `/ui/` on
//! each of its API listeners, with the API's roles. Over the API driver it is the endpoint
//! fleetctl talks to; over a unix socket, a browser needs a tunnel (printed); over the etcd
//! driver, each machine's published API address.

use fleet_core::MachineInfo;

use crate::driver::{Driver, Selection};

/// The lines `fleetctl ui` prints for `chosen` and the cluster's `machines` (read only for
/// the etcd driver and the unix socket, where the endpoint itself is no URL a browser opens).
pub fn lines(chosen: &Selection, machines: &[MachineInfo]) -> Vec<String> {
    let first = chosen.endpoint.split(',').next().unwrap_or("").trim();
    if chosen.driver == Driver::Api {
        if let Some(path) = first.strip_prefix("unix://") {
            return vec![
                format!(
                    "The dashboard is served on {first} (no browser opens a socket); through a tunnel:"
                ),
                format!("  ssh -N -L 8080:{path} HOST    then open http://localhost:8080/ui/"),
            ];
        }
        return vec![format!("{}/ui/", first.trim_end_matches('/'))];
    }
    let mut out: Vec<String> = machines
        .iter()
        .filter(|m| !m.api.is_empty())
        .map(|m| format!("{}\t{}/ui/", m.id, m.api.trim_end_matches('/')))
        .collect();
    if out.is_empty() {
        out.push(
            "No machine publishes an API address (api_advertise): open http://HOST/ui/ on a \
             fleetd's API listener, or use --driver api."
                .to_owned(),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(id: &str, api: &str) -> MachineInfo {
        MachineInfo {
            id: id.parse().unwrap(),
            public_ip: String::new(),
            metadata: Default::default(),
            version: String::new(),
            disable_engine: false,
            api: api.into(),
            fence_at: None,
        }
    }

    fn chosen(driver: Driver, endpoint: &str) -> Selection {
        Selection {
            driver,
            endpoint: endpoint.into(),
        }
    }

    #[test]
    fn the_dashboard_is_under_ui_on_the_api_fleetctl_talks_to_or_each_machines() {
        let https = chosen(Driver::Api, "https://10.0.1.1:49153/");
        assert_eq!(lines(&https, &[]), ["https://10.0.1.1:49153/ui/"]);
        let socket = lines(&chosen(Driver::Api, "unix:///var/run/fleet.sock"), &[]);
        assert!(
            socket[1].contains("ssh -N -L 8080:/var/run/fleet.sock HOST"),
            "{socket:?}"
        );
        let etcd = chosen(Driver::Etcd, "http://127.0.0.1:2379");
        let machines = [machine("m1", "https://10.0.1.1:49153"), machine("m2", "")];
        assert_eq!(lines(&etcd, &machines), ["m1\thttps://10.0.1.1:49153/ui/"]);
        assert!(lines(&etcd, &machines[1..])[0].starts_with("No machine publishes"));
    }
}
