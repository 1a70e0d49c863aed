//! The admin listener (plain HTTP, default `127.0.0.1:9901`, never the client listener):
//! `GET /healthz` (the process serves), `GET /readyz` (listener bound and config loaded;
//! 503 while draining), `GET /metrics` (Prometheus text format).

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::gateway::Gateway;

fn reply(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    r
}

/// Answers one admin request.
pub fn respond(req: &Request<Incoming>, gateway: &Gateway) -> Response<Full<Bytes>> {
    if req.method() != http::Method::GET {
        return reply(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "GET only\n");
    }
    match req.uri().path() {
        "/healthz" => reply(StatusCode::OK, "text/plain", "ok\n"),
        "/readyz" => readyz(gateway),
        "/metrics" => {
            let snap = gateway.snapshot();
            let text = snap.metrics.render(
                snap.replay.stats(),
                snap.router
                    .partners()
                    .iter()
                    .map(|p| (p.config.name.as_str(), p.pool.idle_connections())),
            );
            reply(
                StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                text,
            )
        }
        _ => reply(StatusCode::NOT_FOUND, "text/plain", "not found\n"),
    }
}

/// `/readyz`: 200 `ready` while the listener accepts and the config is loaded, else 503
/// `not ready`; in cluster mode, then the shared store and its nodes, and 503 under
/// `on_error = "closed"` while no node of the store answers (see
/// [`crate::cluster::Cluster::readiness`]).
fn readyz(gateway: &Gateway) -> Response<Full<Bytes>> {
    let (store_ready, detail) = gateway
        .snapshot()
        .cluster
        .as_ref()
        .map_or((true, String::new()), |c| c.readiness());
    if gateway.is_ready() && store_ready {
        reply(StatusCode::OK, "text/plain", format!("ready\n{detail}"))
    } else {
        reply(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            format!("not ready\n{detail}"),
        )
    }
}

/// Serves the admin endpoints until `shutdown` completes.
pub async fn run(listener: TcpListener, gateway: Arc<Gateway>, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    loop {
        let (tcp, _) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(_) => continue,
            },
            _ = &mut shutdown => return,
        };
        let gateway = gateway.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let r = respond(&req, &gateway);
                async move { Ok::<_, Infallible>(r) }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), svc)
                .await;
        });
    }
}
