//! [`fnv1a`]: a hash that is the same on every build and platform (std's is neither), for
//! what must agree across hosts and restarts: where a dedup key lives, a shard's owner-lock
//! name, rendezvous scores.

const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0100_0000_01b3;

/// FNV-1a of `parts`, one after another (no separator: callers that need one pass it).
pub fn fnv1a<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> u64 {
    fnv1a_from(OFFSET, parts)
}

/// [`fnv1a`] continued from `h`, the hash of what came before.
fn fnv1a_from<'a>(mut h: u64, parts: impl IntoIterator<Item = &'a [u8]>) -> u64 {
    for part in parts {
        for b in part {
            h ^= *b as u64;
            h = h.wrapping_mul(PRIME);
        }
    }
    h
}

/// [`fnv1a`] of `parts` through splitmix64's finalizer: FNV alone leaves the hashes of
/// similar names correlated, which rendezvous scores and ring places must not be.
pub fn mixed<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> u64 {
    finish(fnv1a(parts))
}

/// [`mixed`] of a prefix's parts and then `more`, from the prefix's [`fnv1a`] (`state`):
/// one who hashes many suffixes after the same prefix hashes the prefix once.
pub fn mixed_after(state: u64, more: &[u8]) -> u64 {
    finish(fnv1a_from(state, [more]))
}

/// splitmix64's finalizer.
fn finish(mut h: u64) -> u64 {
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_published_fnv1a_values() {
        assert_eq!(fnv1a([&b""[..]]), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a([&b"a"[..]]), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a([&b"foo"[..]]), 0xdcb2_7518_fed9_d577);
        assert_eq!(fnv1a([&b"fo"[..], &b"o"[..]]), fnv1a([&b"foo"[..]]));
        assert_eq!(mixed_after(fnv1a([&b"fo"[..]]), b"o"), mixed([&b"foo"[..]]));
    }
}
