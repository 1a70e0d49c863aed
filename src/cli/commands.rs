//! What the `aipgw` binary does with its command line (the binary itself only picks the
//! allocator and calls [`main`]).
//!
//! Exit codes: 0 success; 1 a runtime failure, a failed `check`, or a certificate
//! `inspect-cert` would reject; 64 (EX_USAGE) a usage or config error.

use std::process::ExitCode;

use super::{Cli, Command};
use crate::config::Config;
use clap::Parser;
use tracing_subscriber::EnvFilter;

use super::shared::{failed, open_files, shared_store, usage, Failure, EX_USAGE};

/// The `aipgw` binary's whole work: parse the command line, run the command, map the
/// outcome to an exit code.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { EX_USAGE } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    // The sockets systemd passed (socket activation), taken and their variables removed
    // while this is the only thread.
    let activated = match &cli.command {
        Command::Run { .. } => match crate::server::activation::from_env() {
            Ok(a) => a,
            Err(e) => {
                eprintln!("aipgw: {e:#}");
                return ExitCode::FAILURE;
            }
        },
        _ => None,
    };
    // `run` and `demo` log as their config says; a bad config is reported before that.
    let path = match &cli.command {
        Command::Run { config, .. } => Some(config),
        #[cfg(feature = "dev")]
        Command::Demo { config } => Some(config),
        _ => None,
    };
    // What the config file holds before it is read, for the reload watcher to start from.
    let at_load = path.map(|p| crate::reload::AtLoad::config_file(p));
    let config = match path.map(|p| Config::load(p)).transpose() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("aipgw: {e:#}");
            return ExitCode::from(EX_USAGE);
        }
    };
    let level = cli
        .log
        .clone()
        .or_else(|| config.as_ref().map(|c| c.log_level.clone()))
        .unwrap_or_else(|| "info".to_owned());
    let json = config
        .as_ref()
        .is_some_and(|c| c.log_format != crate::config::LogFormat::Pretty);
    init_tracing(&level, json);
    // The one TLS crypto provider, installed as the process default before any client
    // (the Redis one takes the default) is built.
    let _ = crate::tls::provider::provider();
    // With per-core workers (the default) connections run on `crate::workers`' threads
    // and this runtime, on the main thread, keeps the accept loop, the admin listener,
    // reloads and the background loops; with `scheduler = "shared"` it is tokio's
    // work-stealing runtime and serves the connections too.
    let shared = config
        .as_ref()
        .is_some_and(|c| c.scheduler == crate::config::Scheduler::Shared);
    let mut builder = if shared {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    builder.enable_all();
    if let Some(n) = config.as_ref().filter(|_| shared).map(|c| c.workers()) {
        builder.worker_threads(n);
    }
    let runtime = match builder.build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("aipgw: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(dispatch(cli.command, config, at_load, activated)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(code, e)) => {
            eprintln!("aipgw: {e:#}");
            ExitCode::from(code)
        }
    }
}

fn init_tracing(level: &str, json: bool) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colour only for a terminal: log files and collectors get plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    if json {
        builder.json().flatten_event(true).init();
    } else {
        builder.init();
    }
}

async fn dispatch(
    command: Command,
    config: Option<Config>,
    at_load: Option<crate::reload::AtLoad>,
    activated: Option<crate::server::activation::Activated>,
) -> Result<(), Failure> {
    match command {
        Command::Run { take_over, .. } => {
            let cfg = config.ok_or_else(|| usage(anyhow::anyhow!("no config")))?;
            super::run::run(cfg, at_load, take_over, activated).await
        }
        Command::Check { config } => {
            let cfg = Config::load(&config).map_err(failed)?;
            // The open-file check `run` and a reload make, with what `run` would raise
            // the limit to.
            let limit = open_files(&cfg)?;
            let need = crate::fdlimit::need(&cfg).total();
            let gateway = crate::Gateway::new(cfg).map_err(failed)?;
            shared_store(&gateway, true).await.map_err(failed)?;
            println!(
                "{}: ok (open files: {need} needed, limit {})",
                config.display(),
                limit.soft
            );
            Ok(())
        }
        Command::InspectCert { file, config } => {
            let cfg = config
                .as_deref()
                .map(Config::load)
                .transpose()
                .map_err(usage)?;
            let suffix = cfg
                .as_ref()
                .map_or("acps.pub".to_owned(), |c| c.aic_domain_suffix.clone());
            let report = crate::inspect::inspect(&file, cfg.as_ref(), &suffix)
                .await
                .map_err(usage)?;
            print!("{}", report.text);
            if report.accepted {
                Ok(())
            } else {
                Err(failed(anyhow::anyhow!(
                    "{}: would be rejected",
                    file.display()
                )))
            }
        }
        #[cfg(feature = "dev")]
        Command::Demo { config: path } => crate::demo::run(&path, super::shared::shutdown_signal())
            .await
            .map_err(usage),
        #[cfg(feature = "dev")]
        Command::DemoPartner { bind } => {
            let listener = tokio::net::TcpListener::bind(&bind)
                .await
                .map_err(|e| failed(anyhow::anyhow!("cannot bind {bind}: {e}")))?;
            eprintln!("demo Partner on http://{bind}");
            let partner = crate::demo::DemoPartner::new(Default::default());
            crate::demo::partner::serve(listener, partner, super::shared::shutdown_signal())
                .await
                .map_err(|e| failed(e.into()))
        }
        Command::Audit {
            command: super::AuditCommand::Verify { files, key },
        } => super::audit::verify(&files, &key),
        #[cfg(feature = "dev")]
        Command::DevCerts { out } => {
            crate::devcerts::write_dev_certs(&out).map_err(failed)?;
            println!("development certificates written to {}", out.display());
            Ok(())
        }
    }
}
