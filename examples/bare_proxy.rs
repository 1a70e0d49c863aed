//! The bare baseline of the load comparison (`benches/load/`): a tokio + hyper + rustls
//! mTLS reverse proxy with no checks at all (`benches/support/bare.rs`).
//!
//! ```sh
//! cargo run --release --example bare_proxy -- --listen 127.0.0.1:0 \
//!     --backend http://127.0.0.1:19030 --cert server.pem --key server.key --ca ca.pem
//! ```
//! Prints `listening on ADDR` once bound.
#![allow(missing_docs)]

#[path = "../benches/support/bare.rs"]
mod bare;

use std::path::PathBuf;

use clap::Parser;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// The backend, `http://host:port`.
    #[arg(long)]
    backend: http::Uri,
    #[arg(long)]
    cert: PathBuf,
    #[arg(long)]
    key: PathBuf,
    /// The CA client certificates must chain to.
    #[arg(long)]
    ca: PathBuf,
    /// CRLs (PEM), repeatable.
    #[arg(long)]
    crl: Vec<PathBuf>,
    /// No session tickets and no session cache: every connection is a full handshake.
    #[arg(long)]
    no_resumption: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let crls: Vec<&std::path::Path> = a.crl.iter().map(PathBuf::as_path).collect();
    let tls = bare::tls_config(&a.cert, &a.key, &a.ca, &crls, !a.no_resumption)?;
    let listener = tokio::net::TcpListener::bind(&a.listen).await?;
    println!("listening on {}", listener.local_addr()?);
    bare::serve(listener, tls, a.backend).await;
    Ok(())
}
