//! Redis Cluster slots: which slot a key falls in, and the slot of the keys a call
//! sends (to name the node a failed call went to, `nodes`).

use std::sync::atomic::{AtomicU32, Ordering};

/// No slot recorded (a command without a key of ours).
pub(crate) const NO_SLOT: u32 = u32::MAX;

/// Slots in a Redis Cluster.
const SLOTS: u16 = 16384;

/// The Redis Cluster slot of `key` (CRC16/XMODEM of its hash tag, or of the whole key).
pub(crate) fn slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let close = key[open + 1..].iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &key[open + 1..open + 1 + close])
    });
    crate::identity::aic::crc16_1021(0, &[tagged.unwrap_or(key)]) % SLOTS
}

/// Records the slot of the first key of ours a command carries (keys start with
/// `key_prefix` and its hash tag), for `Cluster::count_node_error`.
pub(crate) fn record_slot(cmd: &redis::Cmd, prefix: &str, into: &AtomicU32) {
    let head = format!("{prefix}{{{prefix}");
    for arg in cmd.args_iter() {
        if let redis::Arg::Simple(bytes) = arg {
            if bytes.starts_with(head.as_bytes()) {
                into.store(u32::from(slot(bytes)), Ordering::Relaxed);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Known slots (the Redis Cluster specification's CRC16 check value, and keys whose
    /// slot `CLUSTER KEYSLOT` answers).
    #[test]
    fn slots_are_redis_cluster_slots() {
        assert_eq!(slot(b"123456789"), 0x31C3 % SLOTS);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"bar"), 5061);
        assert_eq!(slot(b"{foo}.bar"), 12182);
        // An empty tag is no tag: the whole key.
        assert_ne!(slot(b"{}foo"), slot(b"foo"));
    }

    /// A script call's key (after the digest and the key count) is found; an argument
    /// that is not a key of ours is not taken for one.
    #[test]
    fn the_slot_of_a_calls_keys_is_recorded() {
        let at = AtomicU32::new(NO_SLOT);
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg("0123abcd")
            .arg(1)
            .arg("aipgw:{aipgw:foo}:x")
            .arg("aipgw:{bar}");
        record_slot(&cmd, "aipgw:", &at);
        assert_eq!(at.load(Ordering::Relaxed), u32::from(slot(b"aipgw:foo")));
        let at = AtomicU32::new(NO_SLOT);
        record_slot(redis::cmd("PING").arg("aipgw:{x}"), "aipgw:", &at);
        assert_eq!(at.load(Ordering::Relaxed), NO_SLOT);
    }
}
