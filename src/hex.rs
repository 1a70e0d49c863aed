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

/// Hex text (either case, even length) as bytes; `None` for anything else.
pub(crate) fn decode(text: &str) -> Option<Vec<u8>> {
    let t = text.as_bytes();
    if !t.len().is_multiple_of(2) {
        return None;
    }
    let nibble = |c: u8| char::from(c).to_digit(16).map(|d| d as u8);
    t.chunks(2)
        .map(|p| Some(nibble(p[0])? << 4 | nibble(p[1])?))
        .collect()
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
    }
}
