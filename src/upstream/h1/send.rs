//! [`Sending`]: one request to an HTTP/1.1 Partner, from its write to its response head.
//!
//! Written by hand rather than as an `async fn` so that it has a name: the request path
//! holds it inline in its own future (`upstream::HeadFuture`), where an `async fn`'s
//! future, which has none, was boxed (one allocation per request). Only a new
//! connection's opening, once per connection, is boxed.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Method, Request, Response};
use http_body::Body;
use http_body_util::Full;
use tokio::time::Instant;

use super::{H1Body, H1Client, H1Error, JOIN_BODY};
use crate::upstream::conn::Conn;
use crate::upstream::wire::{encode_head, parse_head_into, Decoder, Parsed};

/// [`H1Client::send`]'s future.
pub(crate) struct Sending {
    client: Arc<H1Client>,
    /// The request's deadline: its connection's timer is moved to it.
    deadline: Instant,
    step: Step,
}

/// What the request needs from its write to its response head.
struct Out {
    /// The request head, with the body behind it when small (`JOIN_BODY`).
    head: BytesMut,
    /// The body when not joined to the head, else empty.
    rest: Bytes,
    method: Method,
    /// The request's map, written out: it takes the response's fields.
    fields: HeaderMap,
    /// The worker whose idle connections this one is taken from and goes back to.
    worker: usize,
}

enum Step {
    /// Not yet polled.
    Start(Request<Full<Bytes>>),
    /// A connection being opened.
    Open(
        Pin<Box<dyn Future<Output = Result<Conn, H1Error>> + Send>>,
        Out,
    ),
    /// The request being written. On a reused connection a failed write means the
    /// Partner closed it while idle: the request is written once more on a new one.
    Write {
        conn: Conn,
        out: Out,
        written: usize,
        reused: bool,
    },
    /// The response head awaited.
    Read(Conn, Out),
    Done,
}

impl H1Client {
    /// Sends a request, yielding the response once its head is read, all by `deadline`
    /// (the connection's own timer, moved to it; a new connection's connect too).
    pub(crate) fn send(self: Arc<Self>, req: Request<Full<Bytes>>, deadline: Instant) -> Sending {
        Sending {
            client: self,
            deadline,
            step: Step::Start(req),
        }
    }

    /// The request written into its buffer, and an idle connection to take it if there
    /// is one.
    fn start(self: &Arc<Self>, req: Request<Full<Bytes>>, deadline: Instant) -> Step {
        let (parts, body) = req.into_parts();
        let body = full_bytes(body);
        let worker = crate::workers::slot(self.idle.workers());
        let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let join = body.len() <= JOIN_BODY;
        let size = 256 + parts.headers.len() * 48 + join as usize * body.len();
        let mut conn = self.idle.take(worker);
        let mut head = match &mut conn {
            Some(conn) => conn.write_buffer(size),
            None => BytesMut::with_capacity(size),
        };
        encode_head(
            &mut head,
            &parts.method,
            target,
            &self.endpoint.authority,
            &parts.headers,
            body.len(),
        );
        let rest = if join {
            head.extend_from_slice(&body);
            Bytes::new()
        } else {
            body
        };
        let out = Out {
            head,
            rest,
            method: parts.method,
            fields: parts.headers,
            worker,
        };
        match conn {
            Some(mut conn) => {
                conn.due(deadline);
                Step::Write {
                    conn,
                    out,
                    written: 0,
                    reused: true,
                }
            }
            None => Step::Open(self.open(deadline), out),
        }
    }

    /// A new connection, for a request due by `deadline`.
    fn open(
        self: &Arc<Self>,
        deadline: Instant,
    ) -> Pin<Box<dyn Future<Output = Result<Conn, H1Error>> + Send>> {
        let client = self.clone();
        Box::pin(async move {
            let c = &client;
            let open = Conn::open(&c.endpoint, &c.budget, c.connect_timeout, deadline);
            Ok(tokio::time::timeout_at(deadline, open)
                .await
                .map_err(|_| H1Error::TimedOut)??)
        })
    }

    /// The response to what `conn` carried, from its head.
    fn respond(
        &self,
        conn: Conn,
        head: crate::upstream::wire::Head,
        worker: usize,
    ) -> Response<H1Body> {
        let mut body = H1Body {
            conn: Some(conn),
            decoder: Decoder::new(head.framing),
            keep_alive: head.keep_alive,
            home: (self.idle.clone(), worker),
        };
        if body.decoder.is_done() {
            body.finish();
        }
        let mut resp = Response::new(body);
        *resp.status_mut() = head.status;
        *resp.version_mut() = head.version;
        *resp.headers_mut() = head.headers;
        resp
    }
}

/// A `Full` body's bytes: its one frame is there at its first poll.
fn full_bytes(mut body: Full<Bytes>) -> Bytes {
    let mut cx = Context::from_waker(Waker::noop());
    match Pin::new(&mut body).poll_frame(&mut cx) {
        Poll::Ready(Some(Ok(frame))) => frame.into_data().unwrap_or_default(),
        _ => Bytes::new(),
    }
}

impl Future for Sending {
    type Output = Result<Response<H1Body>, H1Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        loop {
            // Each arm either returns or says the next step; a failure drops the
            // connection (closing it), as the `?` of an `async fn` would.
            let next = match &mut this.step {
                Step::Start(_) => {
                    let Step::Start(req) = std::mem::replace(&mut this.step, Step::Done) else {
                        unreachable!("matched just above")
                    };
                    this.client.start(req, this.deadline)
                }
                Step::Open(opening, _) => {
                    let opened = ready!(opening.as_mut().poll(cx));
                    let Step::Open(_, out) = std::mem::replace(&mut this.step, Step::Done) else {
                        unreachable!("matched just above")
                    };
                    Step::Write {
                        conn: opened?,
                        out,
                        written: 0,
                        reused: false,
                    }
                }
                Step::Write {
                    conn,
                    out,
                    written,
                    reused,
                } => {
                    let wrote = ready!(conn.poll_write(cx, &out.head, &out.rest, written));
                    let reused = *reused;
                    let Step::Write {
                        mut conn, mut out, ..
                    } = std::mem::replace(&mut this.step, Step::Done)
                    else {
                        unreachable!("matched just above")
                    };
                    match wrote? {
                        Ok(()) => {
                            conn.read_into(std::mem::take(&mut out.head));
                            Step::Read(conn, out)
                        }
                        Err(_) if reused => Step::Open(this.client.open(this.deadline), out),
                        Err(e) => return Poll::Ready(Err(H1Error::Write(e))),
                    }
                }
                Step::Read(conn, out) => loop {
                    match parse_head_into(
                        &mut conn.buf,
                        &out.method,
                        this.client.max_head,
                        &mut out.fields,
                    ) {
                        Ok(Parsed::Head(head)) => {
                            let Step::Read(conn, out) =
                                std::mem::replace(&mut this.step, Step::Done)
                            else {
                                unreachable!("matched just above")
                            };
                            return Poll::Ready(Ok(this.client.respond(conn, head, out.worker)));
                        }
                        Ok(Parsed::Informational) => continue,
                        Ok(Parsed::Partial) => {}
                        Err(e) => {
                            this.step = Step::Done;
                            return Poll::Ready(Err(e.into()));
                        }
                    }
                    let filled = match ready!(conn.poll_fill_due(cx)) {
                        Ok(Ok(0)) => Err(H1Error::ClosedBeforeHead),
                        Ok(Ok(_)) => Ok(()),
                        Ok(Err(e)) => Err(H1Error::Read(e)),
                        Err(timed_out) => Err(timed_out.into()),
                    };
                    if let Err(e) = filled {
                        this.step = Step::Done;
                        return Poll::Ready(Err(e));
                    }
                },
                Step::Done => panic!("`Sending` polled after completion"),
            };
            this.step = next;
        }
    }
}
