//! Free ports for test servers.

use std::net::{Ipv4Addr, TcpListener};

use rand::Rng;

/// Where test ports are picked: below Linux's ephemeral range (32768–60999 by default). A port
/// of that range, released by the picker, can be taken by any outgoing connection (an etcd
/// member dialling its peers, a client) before the server binds it; ports here are only ever
/// taken by a bind.
const TEST_PORTS: std::ops::Range<u16> = 20000..32768;

/// `count` distinct ports nobody listens on right now, on any address, all held until every
/// one is picked (so none is picked twice). Another process may still bind one before the
/// server does: callers retry a failed start on new ports.
pub fn free_ports(count: usize) -> Vec<u16> {
    let mut held: Vec<TcpListener> = Vec::with_capacity(count);
    let mut rng = rand::rng();
    for _ in 0..count * 200 {
        if held.len() == count {
            break;
        }
        let port = rng.random_range(TEST_PORTS);
        if let Ok(listener) = TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)) {
            held.push(listener);
        }
    }
    // A crowded range: the kernel's own pick, still distinct while held.
    while held.len() < count {
        held.push(TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).expect("binding a free port"));
    }
    held.iter()
        .map(|l| l.local_addr().expect("bound socket has an address").port())
        .collect()
}
