//! Lowercase hex encoding (certificate fingerprints, trace and request ids), in one
//! allocation, and decoding (registrar salts).

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// `bytes` as lowercase hex.
pub(crate) fn encode(bytes: &[u8]) -> String {
    let mut out = vec![0u8; bytes.len() * 2];
    encode_into(bytes, &mut out);
    String::from_utf8(out).expect("hex digits are ASCII")
}

/// `bytes` as lowercase hex into `out` (twice as long), without allocating.
pub(crate) fn encode_into(bytes: &[u8], out: &mut [u8]) {
    for (b, pair) in bytes.iter().zip(out.chunks_exact_mut(2)) {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 0x0f)];
    }
}

/// One hex digit's value (either case).
fn nibble(c: u8) -> Option<u8> {
    char::from(c).to_digit(16).map(|d| d as u8)
}

/// Hex text (either case, even length) as bytes; `None` for anything else.
pub(crate) fn decode(text: &str) -> Option<Vec<u8>> {
    let t = text.as_bytes();
    if !t.len().is_multiple_of(2) {
        return None;
    }
    t.chunks(2)
        .map(|p| Some(nibble(p[0])? << 4 | nibble(p[1])?))
        .collect()
}

/// Exactly `2 * N` hex digits (trace and span ids) as `N` bytes, without allocating.
pub(crate) fn decode_array<const N: usize>(hex: &[u8]) -> Option<[u8; N]> {
    if hex.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (o, p) in out.iter_mut().zip(hex.chunks_exact(2)) {
        *o = nibble(p[0])? << 4 | nibble(p[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn encodes() {
        assert_eq!(super::encode(&[0x00, 0xab, 0x7f, 0xff]), "00ab7fff");
        assert_eq!(super::encode(&[]), "");
    }

    #[test]
    fn decodes() {
        assert_eq!(
            super::decode("00aB7fFF"),
            Some(vec![0x00, 0xab, 0x7f, 0xff])
        );
        assert_eq!(super::decode(""), Some(vec![]));
        assert_eq!(super::decode("abc"), None);
        assert_eq!(super::decode("zz"), None);
        assert_eq!(super::decode_array::<2>(b"00aB"), Some([0x00, 0xab]));
        assert_eq!(super::decode_array::<2>(b"00a"), None);
        assert_eq!(super::decode_array::<1>(b"g0"), None);
    }
}
