//! Lowercase hex encoding (certificate fingerprints, trace and request ids), in one
//! allocation.

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// `bytes` as lowercase hex.
pub fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn encodes() {
        assert_eq!(super::encode(&[0x00, 0xab, 0x7f, 0xff]), "00ab7fff");
        assert_eq!(super::encode(&[]), "");
    }
}
