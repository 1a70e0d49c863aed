//! A Partner that embeds aipgw's request path instead of running behind a separate
//! gateway: its own TLS listener (the config's rustls settings), identity from its own
//! handshake, and the gateway's layers (identity, envelope, policy, quotas, permits) in
//! front of its own handler, which sees only requests that passed them.
//!
//! ```text
//! cargo run --example embedded_partner -- config/embedded.toml
//! curl --cacert certs/ca.pem --cert certs/leader-v2.pem --key certs/leader-v2.key \
//!   https://127.0.0.1:18444/rpc -d @request.json
//! ```
//!
//! `tests/it/embedded.rs` runs [`serve`] and checks that a bad `senderId` is refused with
//! `-32009` and a missing certificate with `-32008`, exactly as the gateway refuses them.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use aipgw::layers::{self, Caller, ConnInfo};
use aipgw::Gateway;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

/// The Partner's own work: here, an answer naming the verified caller. It runs only for
/// requests the layers let through: a verified, unblocked AIC that is the message's
/// `senderId`, a valid envelope, within quotas and the access rules.
async fn handle(req: Request<Bytes>) -> Result<Response<Full<Bytes>>, Infallible> {
    let caller = req
        .extensions()
        .get::<Caller>()
        .map(|c| c.0.aic.to_string())
        .unwrap_or_default();
    let request: serde_json::Value = serde_json::from_slice(req.body()).unwrap_or_default();
    let task = request["params"]["message"]["taskId"].clone();
    let answer = serde_json::json!({
        "jsonrpc": "2.0",
        "id": request["id"],
        "result": {
            "type": "task",
            "id": task,
            "status": { "state": "completed" },
            "servedFor": caller,
        },
    });
    let mut resp = Response::new(Full::new(Bytes::from(answer.to_string())));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

/// Serves `listener` until `shutdown`: TLS with `gateway`'s listener settings, each
/// connection's identity computed once, each request through the layers to `handler`.
pub async fn serve<H, RB>(
    listener: TcpListener,
    gateway: Arc<Gateway>,
    handler: H,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()>
where
    H: aipgw::layers::Handler<Response = Response<RB>>,
    RB: aipgw::layers::HandlerBody,
{
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => accepted?,
            () = &mut shutdown => return Ok(()),
        };
        let (gateway, handler) = (gateway.clone(), handler.clone());
        tokio::spawn(async move {
            let snap = gateway.snapshot();
            let Ok(tls) = TlsAcceptor::from(snap.tls.config.clone()).accept(tcp).await else {
                return;
            };
            let session = tls.get_ref().1;
            let sni = session.server_name();
            let conn = Arc::new(ConnInfo::accepted(peer, session, sni, &snap));
            let stack = layers::embedded(gateway, conn, handler);
            let svc = service_fn(move |req| stack.clone().oneshot(req));
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), svc)
                .await;
        });
    }
}

#[allow(dead_code)] // the integration test includes this file for `serve` alone
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "config/embedded.toml".to_owned());
    let config = aipgw::config::Config::load(std::path::Path::new(&path))?;
    let bind = config.listener.bind;
    let gateway = Gateway::new(config)?;
    let listener = TcpListener::bind(bind).await?;
    eprintln!("embedded Partner on https://{bind}");
    serve(listener, gateway, tower::service_fn(handle), async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
}
