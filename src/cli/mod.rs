//! The command line: its arguments (clap) here, what each command does in `commands`.

mod audit;
mod commands;
mod run;
mod shared;
mod upgrade;

use std::path::PathBuf;

pub use commands::main;

use clap::{Parser, Subcommand};

/// aipgw: a gateway for AIP Partner agents.
#[derive(Debug, Parser)]
#[command(name = "aipgw", version, about)]
pub struct Cli {
    /// Log filter (tracing EnvFilter syntax), overriding the config's `[log] level`;
    /// RUST_LOG overrides both.
    #[arg(long, global = true)]
    pub log: Option<String>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway.
    Run {
        /// Config file.
        #[arg(long, short)]
        config: PathBuf,
        /// Take the listening sockets over from the gateway running with this config's
        /// `listener.handover_socket`; it stops accepting and drains once this one
        /// serves (an upgrade without a refused connection).
        #[arg(long)]
        take_over: bool,
    },
    /// Load and validate a config, including every certificate and key it names.
    Check {
        /// Config file.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Run the gateway in front of the demo Partner with the development certificates.
    #[cfg(feature = "dev")]
    Demo {
        /// Config file.
        #[arg(long, short, default_value = "config/aipgw.toml")]
        config: PathBuf,
    },
    /// Run the demo Partner alone (plain HTTP).
    #[cfg(feature = "dev")]
    DemoPartner {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:19021")]
        bind: String,
    },
    /// Show the AIC(s) a certificate carries, their profile and check code, its validity,
    /// issuer and fingerprint, and (with --config) whether the configured CAs and CRLs
    /// accept it. Exit 0 if it would be accepted, 1 if not.
    InspectCert {
        /// PEM file (the first certificate; later ones are intermediates).
        file: PathBuf,
        /// Config whose CAs, CRLs and block list to check against.
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    /// The audit log (`[audit]`).
    Audit {
        /// What to do with it.
        #[command(subcommand)]
        command: AuditCommand,
    },
    /// Write development certificates (a CA, gateway, Leaders, Partner).
    #[cfg(feature = "dev")]
    DevCerts {
        /// Output folder.
        #[arg(long, default_value = "certs")]
        out: PathBuf,
    },
}

/// `aipgw audit ...`
#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Check every record's signature and the hash chain through the files, in the order
    /// given (rotated files first: FILE.2 FILE.1 FILE). Names the first record changed,
    /// removed, inserted or reordered; exit 0 if the chain holds, 1 if not.
    Verify {
        /// The audit files, oldest first.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Public keys (SubjectPublicKeyInfo PEM files, `openssl pkey -pubout`),
        /// comma-separated: every key the records may be signed with.
        #[arg(long, required = true)]
        key: String,
    },
}
