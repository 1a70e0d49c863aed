//! Per-source bound on connections still in their TLS handshake.
//!
//! Every accepted connection holds a `max_connections` permit, and a TLS handshake may
//! take up to `handshake_timeout`: without a per-source bound, one host opening idle
//! sockets could hold every permit and stall everyone else. A connection from a source
//! already at `max_handshakes_per_ip` is closed at once; the slot is released as soon as
//! the handshake ends (done, failed or timed out).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// Handshakes in progress per source address.
pub struct HandshakeSlots {
    max: usize,
    busy: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// One handshake in progress; released on drop.
pub struct HandshakeSlot {
    ip: IpAddr,
    busy: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl HandshakeSlots {
    /// At most `max` handshakes in progress per source address.
    pub fn new(max: usize) -> HandshakeSlots {
        HandshakeSlots {
            max,
            busy: Arc::default(),
        }
    }

    /// A slot for `ip`, or `None` when it is at its limit. The map holds only addresses
    /// with a handshake in progress, so it is bounded by `max_connections`.
    pub fn try_take(&self, ip: IpAddr) -> Option<HandshakeSlot> {
        let mut busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        let n = busy.entry(ip).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(HandshakeSlot {
            ip,
            busy: self.busy.clone(),
        })
    }
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        let mut busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = busy.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                busy.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_source_and_released_on_drop() {
        let s = HandshakeSlots::new(2);
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let b: IpAddr = "127.0.0.3".parse().unwrap();
        let a1 = s.try_take(a).unwrap();
        let _a2 = s.try_take(a).unwrap();
        assert!(s.try_take(a).is_none());
        assert!(s.try_take(b).is_some(), "another source is unaffected");
        drop(a1);
        assert!(s.try_take(a).is_some());
    }
}
