//! Reading a request body once, bounded in size, into one contiguous `Bytes`.
//!
//! A body that arrives in one frame (the common case) is kept as that very `Bytes`, with
//! no copy; a body in several frames is copied once. `http_body_util::Limited` +
//! `collect` would do the same for one frame (its `BufList` hands a lone frame back);
//! this is written by hand for the rest: a declared `Content-Length` over the bound is
//! refused before a byte is read, the buffer for several frames is sized once from
//! `Content-Length`, and "too large" stays apart from a failed read.
//! The envelope parser borrows from the result and `layers::Forward` sends the same `Bytes` on.
//! The time bound is applied by the caller (`listener.body_read_timeout`).

use bytes::{Bytes, BytesMut};
use http_body::Body;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::BodyExt;

/// Errors inside response bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The body of every response the gateway sends.
pub type ResponseBody = UnsyncBoxBody<Bytes, BoxError>;

/// A complete response body from bytes.
pub fn full(b: Bytes) -> ResponseBody {
    http_body_util::Full::new(b)
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// A body that keeps `guard` (permits, counters, an activity mark) alive until the body
/// ends or is dropped: the one guard-holding body, for the Partner in-flight and stream
/// permits, the open-stream gauge and a connection's activity.
pub struct Held<B, G> {
    body: B,
    _guard: G,
}

impl<B, G> Held<B, G> {
    /// `body`, holding `guard`.
    pub fn new(body: B, guard: G) -> Held<B, G> {
        Held {
            body,
            _guard: guard,
        }
    }
}

impl<B: Body + Unpin, G: Unpin> Body for Held<B, G> {
    type Data = B::Data;
    type Error = B::Error;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }
    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }
    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Where `part` lies inside `whole` (it was parsed by borrowing from it), if it does.
pub fn position_in(whole: &[u8], part: &[u8]) -> Option<std::ops::Range<usize>> {
    let (base, at) = (whole.as_ptr() as usize, part.as_ptr() as usize);
    let start = at.checked_sub(base)?;
    (start + part.len() <= whole.len()).then_some(start..start + part.len())
}

/// `part` as a `Bytes`: a slice of `body` (a reference count, no copy) when it lies
/// inside it, as what is parsed by borrowing from the body does; a copy otherwise (an
/// unescaped string, say).
pub fn share_or_copy(body: &Bytes, part: &[u8]) -> Bytes {
    match position_in(body, part) {
        Some(range) => body.slice(range),
        None => Bytes::copy_from_slice(part),
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
pub fn read_bounded<B>(body: B, content_length: Option<u64>, limit: usize) -> ReadBounded<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    ReadBounded {
        body,
        content_length,
        limit,
        first: None,
        buf: None,
        total: 0,
        declared_too_large: content_length.is_some_and(|n| n > limit as u64),
    }
}

/// The future of [`read_bounded`]: a named type, so the request path's `ReadBody` step
/// can hold it without boxing.
pub struct ReadBounded<B> {
    body: B,
    content_length: Option<u64>,
    limit: usize,
    first: Option<Bytes>,
    buf: Option<BytesMut>,
    total: usize,
    declared_too_large: bool,
}

impl<B> ReadBounded<B> {
    fn take(&mut self) -> Bytes {
        match (self.first.take(), self.buf.take()) {
            (_, Some(b)) => b.freeze(),
            (Some(f), None) => f,
            (None, None) => Bytes::new(),
        }
    }

    fn push(&mut self, data: Bytes) {
        match (&mut self.first, &mut self.buf) {
            (None, None) => self.first = Some(data),
            (Some(_), None) => {
                let head = self.first.take().unwrap_or_default();
                let total = self.total;
                let cap = self.content_length.map_or(total, |n| n as usize).max(total);
                let mut b = BytesMut::with_capacity(cap);
                b.extend_from_slice(&head);
                b.extend_from_slice(&data);
                self.buf = Some(b);
            }
            (_, Some(b)) => b.extend_from_slice(&data),
        }
    }
}

impl<B> std::future::Future for ReadBounded<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Output = Result<Bytes, BodyError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        use std::task::Poll;
        let this = &mut *self;
        if this.declared_too_large {
            return Poll::Ready(Err(BodyError::TooLarge));
        }
        loop {
            let frame = match std::pin::Pin::new(&mut this.body).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => return Poll::Ready(Ok(this.take())),
                Poll::Ready(Some(Err(_))) => return Poll::Ready(Err(BodyError::Read)),
                Poll::Ready(Some(Ok(frame))) => frame,
            };
            let Ok(data) = frame.into_data() else {
                continue; // trailers carry nothing the gateway uses
            };
            if data.is_empty() {
                continue;
            }
            this.total += data.len();
            if this.total > this.limit {
                return Poll::Ready(Err(BodyError::TooLarge));
            }
            this.push(data);
        }
    }
}

/// The `Content-Length` a message declares, when it is one number.
pub(crate) fn declared_length(headers: &http::HeaderMap) -> Option<u64> {
    headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
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
