//! Which shard a task belongs to. Shards split the due-time index so that several queue loops (and,
//! with PostgreSQL, several nodes) can each own a part. The hash is FNV-1a: stable across processes,
//! versions and platforms, which matters because the shard is stored with the task.

use crate::TaskId;

/// The shard of a task: by `(queue, key)` when it has a key (so one business key always lands on one
/// shard), by id otherwise.
pub fn shard_for(queue: &str, key: Option<&str>, id: &TaskId, shard_count: u32) -> u32 {
    let count = shard_count.max(1);
    let mut h = Fnv::new();
    match key {
        Some(k) => {
            h.write(queue.as_bytes());
            h.write(&[0xff]);
            h.write(k.as_bytes());
        }
        None => h.write(id.as_bytes()),
    }
    (h.finish() % u64::from(count)) as u32
}

/// The node that owns `shard` among `nodes`: rendezvous (highest random weight) hashing. Every
/// node computes the same answer from the same membership, and when a node joins or leaves only the
/// shards it wins or held move (about `1/n` of them).
pub fn rendezvous_owner(shard: u32, nodes: &[String]) -> Option<&str> {
    nodes
        .iter()
        .max_by_key(|node| {
            let mut h = Fnv::new();
            h.write(node.as_bytes());
            h.write(&[0xfe]);
            h.write(&shard.to_le_bytes());
            // Finalise (FNV's low bits mix poorly for short inputs).
            let mut x = h.finish();
            x ^= x >> 33;
            x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
            x ^= x >> 33;
            (x, node.as_str())
        })
        .map(String::as_str)
}

struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_key_same_shard_and_in_range() {
        let a = TaskId::from_bytes([1; 16]);
        let b = TaskId::from_bytes([2; 16]);
        assert_eq!(
            shard_for("q", Some("k"), &a, 8),
            shard_for("q", Some("k"), &b, 8)
        );
        for i in 0..=255u8 {
            let id = TaskId::from_bytes([i; 16]);
            assert!(shard_for("q", None, &id, 8) < 8);
        }
        assert_eq!(shard_for("q", None, &a, 0), 0);
    }

    #[test]
    fn rendezvous_moves_only_the_leavers_shards() {
        let three: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let two: Vec<String> = ["a", "b"].iter().map(|s| s.to_string()).collect();
        let mut per_node = std::collections::HashMap::new();
        for shard in 0..300 {
            let before = rendezvous_owner(shard, &three).unwrap();
            *per_node.entry(before).or_insert(0) += 1;
            let after = rendezvous_owner(shard, &two).unwrap();
            if before != "c" {
                assert_eq!(before, after, "shard {shard} moved without cause");
            }
        }
        for (node, n) in per_node {
            assert!((60..=140).contains(&n), "{node} owns {n} of 300");
        }
        assert_eq!(rendezvous_owner(1, &[]), None);
    }

    #[test]
    fn hash_is_stable() {
        // Stored with every task: changing the function would strand tasks on the wrong shard.
        let id = TaskId::from_bytes([7; 16]);
        assert_eq!(shard_for("orders", Some("order-123"), &id, 1024), 86);
        assert_eq!(shard_for("orders", None, &id, 1024), 245);
    }
}
