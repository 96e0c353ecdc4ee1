//! Every role's etcd requests over one phase of a scale run, and their by-role lines.

use crate::counting::{Method, Tally};
use crate::sim::Sim;

/// Every role's requests over one phase.
#[derive(Debug, Clone, Copy, Default)]
pub struct Roles {
    pub client: Tally,
    pub engines: Tally,
    pub agents: Tally,
    pub presence: Tally,
}

impl Roles {
    pub fn now(sim: &Sim) -> Roles {
        Roles {
            client: sim.roles.client.tally(),
            engines: sim.roles.engines.tally(),
            agents: sim.roles.agents.tally(),
            presence: sim.roles.presence.tally(),
        }
    }

    pub fn since(self, sim: &Sim) -> Roles {
        let now = Roles::now(sim);
        Roles {
            client: now.client - self.client,
            engines: now.engines - self.engines,
            agents: now.agents - self.agents,
            presence: now.presence - self.presence,
        }
    }

    pub(super) fn all(&self) -> [(&'static str, &Tally); 4] {
        [
            ("fleetctl", &self.client),
            ("engines", &self.engines),
            ("agents", &self.agents),
            ("presence", &self.presence),
        ]
    }

    /// Writes by fleetctl, the engines and the agents (not lease keep-alives).
    pub fn writes(&self) -> u64 {
        self.client.all_writes() + self.engines.all_writes() + self.agents.all_writes()
    }

    /// Every put and delete, presence's included: the keys the run wrote.
    pub fn keys_written(&self) -> u64 {
        self.all().iter().map(|(_, t)| t.all_writes()).sum()
    }

    /// Requests that failed on their deadline, every role's.
    pub fn timeouts(&self) -> u64 {
        self.all().iter().map(|(_, t)| t.timeouts).sum()
    }

    /// `fleetctl 0, engines 35, agents 5196, presence 2633`.
    pub fn timeouts_by_role(&self) -> String {
        let by_role: Vec<String> = self
            .all()
            .iter()
            .map(|(role, t)| format!("{role} {}", t.timeouts))
            .collect();
        by_role.join(", ")
    }

    /// `agents txn 20, range 3; engines txn 2`: the roles with requests past their deadline,
    /// by method.
    pub fn timeouts_by_method(&self) -> String {
        let by_role: Vec<String> = self
            .all()
            .iter()
            .filter(|(_, t)| t.timeouts > 0)
            .map(|(role, t)| format!("{role} {}", t.timeouts_by_method()))
            .collect();
        by_role.join("; ")
    }

    /// `fleetctl 96 / 812 ms, engines …`: each role's transactions, mean over this tally and
    /// slowest since counting began.
    pub fn txn_latency_by_role(&self) -> String {
        let by_role: Vec<String> = self.all()[..3]
            .iter()
            .map(|(role, t)| {
                let (mean, most) = (t.mean_latency(Method::Txn), t.max_latency(Method::Txn));
                format!("{role} {} / {} ms", mean.as_millis(), most.as_millis())
            })
            .collect();
        by_role.join(", ")
    }

    /// Keep-alives of leases etcd no longer had.
    pub fn leases_lost(&self) -> u64 {
        self.all().iter().map(|(_, t)| t.leases_lost).sum()
    }

    /// Requests by fleetctl, the engines and the agents.
    pub fn requests(&self) -> u64 {
        self.client.total() + self.engines.total() + self.agents.total()
    }
}
