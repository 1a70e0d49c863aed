//! Reading a request body once, bounded in size, into one contiguous `Bytes`.
//!
//! A body that arrives in one frame (the common case) is kept as that very `Bytes`, with
//! no copy; a body in several frames is copied once. `http_body_util::Limited` +
//! `collect` would do the same for one frame (its `BufList` hands a lone frame back);
//! this is written by hand for the rest: a declared `Content-Length` over the bound is
//! refused before a byte is read, the buffer for several frames is sized once from
//! `Content-Length`, and "too large" stays apart from a failed read.
//! The envelope parser borrows from the result and the proxy forwards the same `Bytes`.
//! The time bound is applied by the caller (`listener.body_read_timeout`).

use bytes::{Bytes, BytesMut};
use http_body::Body;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::BodyExt;

/// Errors inside response bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The body of every response the gateway sends.
pub type ResponseBody = UnsyncBoxBody<Bytes, BoxError>;

/// `part` as a `Bytes`: a slice of `body` (a reference count, no copy) when it lies
/// inside it, as what is parsed by borrowing from the body does; a copy otherwise (an
/// unescaped string, say).
pub fn share_or_copy(body: &Bytes, part: &[u8]) -> Bytes {
    let (base, at) = (body.as_ptr() as usize, part.as_ptr() as usize);
    if at >= base && at + part.len() <= base + body.len() {
        body.slice_ref(part)
    } else {
        Bytes::copy_from_slice(part)
    }
}

/// Why a body could not be read.
#[derive(Debug, PartialEq, Eq)]
pub enum BodyError {
    /// More than the limit.
    TooLarge,
    /// The stream failed (client reset, protocol error).
    Read,
}

/// Reads a whole body of at most `limit` bytes.
pub async fn read_bounded<B>(
    mut body: B,
    content_length: Option<u64>,
    limit: usize,
) -> Result<Bytes, BodyError>
where
    B: Body<Data = Bytes> + Unpin,
{
    if content_length.is_some_and(|n| n > limit as u64) {
        return Err(BodyError::TooLarge);
    }
    let mut first: Option<Bytes> = None;
    let mut buf: Option<BytesMut> = None;
    let mut total = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| BodyError::Read)?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers carry nothing the gateway uses
        };
        if data.is_empty() {
            continue;
        }
        total += data.len();
        if total > limit {
            return Err(BodyError::TooLarge);
        }
        match (&mut first, &mut buf) {
            (None, None) => first = Some(data),
            (Some(_), None) => {
                let head = first.take().unwrap_or_default();
                let cap = content_length.map_or(total, |n| n as usize).max(total);
                let mut b = BytesMut::with_capacity(cap);
                b.extend_from_slice(&head);
                b.extend_from_slice(&data);
                buf = Some(b);
            }
            (_, Some(b)) => b.extend_from_slice(&data),
        }
    }
    Ok(match (first, buf) {
        (_, Some(b)) => b.freeze(),
        (Some(f), None) => f,
        (None, None) => Bytes::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_part_of_the_body_is_shared_and_anything_else_copied() {
        let body = Bytes::from_static(b"{\"id\":\"abc\"}");
        let inside = share_or_copy(&body, &body[7..10]);
        assert_eq!(
            (inside.as_ptr(), &inside[..]),
            (body[7..].as_ptr(), &b"abc"[..])
        );
        let elsewhere = String::from("abc");
        let copied = share_or_copy(&body, elsewhere.as_bytes());
        assert_eq!(&copied[..], b"abc");
        assert_ne!(copied.as_ptr(), elsewhere.as_ptr());
    }
    use http_body_util::{Full, StreamBody};
    use std::convert::Infallible;

    fn chunks(
        parts: &[&'static [u8]],
    ) -> StreamBody<
        impl futures_util::Stream<Item = Result<http_body::Frame<Bytes>, Infallible>> + Unpin,
    > {
        let frames: Vec<_> = parts
            .iter()
            .map(|p| Ok(http_body::Frame::data(Bytes::from_static(p))))
            .collect();
        StreamBody::new(futures_util::stream::iter(frames))
    }

    #[tokio::test]
    async fn single_frame_is_the_same_allocation() {
        let data = Bytes::from(vec![b'x'; 100]);
        let ptr = data.as_ptr();
        let out = read_bounded(Full::new(data), Some(100), 1000)
            .await
            .unwrap();
        assert_eq!(out.as_ptr(), ptr);
        assert_eq!(out.len(), 100);
    }

    #[tokio::test]
    async fn several_frames_are_joined() {
        let out = read_bounded(chunks(&[b"ab", b"cd", b"e"]), None, 10)
            .await
            .unwrap();
        assert_eq!(&out[..], b"abcde");
    }

    #[tokio::test]
    async fn limits() {
        assert_eq!(
            read_bounded(Full::new(Bytes::from_static(b"x")), Some(11), 10).await,
            Err(BodyError::TooLarge)
        );
        assert_eq!(
            read_bounded(chunks(&[b"123456", b"78901"]), None, 10).await,
            Err(BodyError::TooLarge)
        );
        assert_eq!(
            read_bounded(chunks(&[b"1234567890"]), None, 10)
                .await
                .unwrap()
                .len(),
            10
        );
    }
}
