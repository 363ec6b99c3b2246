//! Coverage-guided fuzzing of the user-space packet decoder: it must never panic, and
//! whatever it accepts must re-encode to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use xagg_common::wire::{self, HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    if let Some(h) = wire::Header::from_bytes(data) {
        assert_eq!(&h.to_bytes()[..], &data[..HEADER_LEN]);
    }
    if let Ok(p) = wire::decode(data) {
        let mut out = vec![0u8; data.len() + 8];
        let n = wire::encode(&p.header, p.payload, &mut out).expect("room");
        // Padding is zero when encoded; a received packet may carry any padding bytes.
        assert_eq!(n, data.len());
        assert_eq!(
            &out[..HEADER_LEN + p.payload.len()],
            &data[..HEADER_LEN + p.payload.len()]
        );
    }
});
