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
    fn hash_is_stable() {
        // Stored with every task: changing the function would strand tasks on the wrong shard.
        let id = TaskId::from_bytes([7; 16]);
        assert_eq!(shard_for("orders", Some("order-123"), &id, 1024), 86);
        assert_eq!(shard_for("orders", None, &id, 1024), 245);
    }
}
