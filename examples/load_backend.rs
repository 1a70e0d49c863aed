//! The static Partner of the load comparison (`benches/load/`): plain HTTP/1.1, a fixed
//! JSON-RPC answer, and `--events` SSE events for a `stream` request
//! (`benches/support/backend.rs`). Prints `listening on ADDR` once bound.
#![allow(missing_docs)]

#[path = "../benches/support/backend.rs"]
mod backend;

use clap::Parser;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// Events in the answer to a `stream` request.
    #[arg(long, default_value_t = 1000)]
    events: usize,
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    // One thread: the backend shares the load generator's core.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(&a.listen).await?;
        println!("listening on {}", listener.local_addr()?);
        backend::serve(listener, a.events).await;
        Ok(())
    })
}
