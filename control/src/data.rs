//! Deterministic test data: what member `m` of a run with seed `s` contributes, so every
//! worker can compute the expected result of an allreduce on its own and verify it.

/// splitmix64: a fast, well-mixed hash of a counter.
#[inline]
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Element `i` of member `member`'s buffer.
#[inline]
pub fn element(seed: u64, member: u32, i: usize) -> i32 {
    mix(seed ^ ((member as u64) << 40) ^ i as u64) as i32
}

pub fn fill(seed: u64, member: u32, buf: &mut [i32]) {
    for (i, x) in buf.iter_mut().enumerate() {
        *x = element(seed, member, i);
    }
}

/// The wrapping sum over `members` members, element by element.
pub fn expected_sum(seed: u64, members: u32, len: usize) -> Vec<i32> {
    let mut out = vec![0i32; len];
    for m in 0..members {
        for (i, x) in out.iter_mut().enumerate() {
            *x = x.wrapping_add(element(seed, m, i));
        }
    }
    out
}
