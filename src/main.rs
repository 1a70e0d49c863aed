//! The `aipgw` binary: a thin shell over the library.

use std::process::ExitCode;

use aipgw::cli::{Cli, Command};
use aipgw::config::Config;
use clap::Parser;
use tokio::net::TcpListener;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&cli.log))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("aipgw: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(dispatch(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("aipgw: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn dispatch(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Run { config } => {
            let cfg = Config::load(&config)?;
            let bind = cfg.listener.bind;
            let gateway = aipgw::Gateway::new(cfg)?;
            let listener = TcpListener::bind(bind).await?;
            tracing::info!(%bind, "aipgw listening");
            aipgw::server::run(listener, gateway, shutdown_signal()).await
        }
        Command::Check { config } => {
            let cfg = Config::load(&config)?;
            aipgw::Gateway::new(cfg)?;
            println!("{}: ok", config.display());
            Ok(())
        }
        Command::Demo { config } => aipgw::demo::run(&config, shutdown_signal()).await,
        Command::DemoPartner { bind } => {
            let listener = TcpListener::bind(&bind).await?;
            eprintln!("demo Partner on http://{bind}");
            let partner = aipgw::demo::DemoPartner::new(Default::default());
            Ok(aipgw::demo::partner::serve(listener, partner, shutdown_signal()).await?)
        }
        Command::DevCerts { out } => {
            aipgw::devcerts::write_dev_certs(&out)?;
            println!("development certificates written to {}", out.display());
            Ok(())
        }
    }
}

/// Completes on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
    tracing::info!("shutting down: draining connections");
}
