//! `SIGUSR2`: the running gateway starts its own successor, `aipgw run --take-over` with
//! the command line it was started with (the program as named then, so a binary replaced
//! on disk is the new one), which takes the listening sockets over
//! (`crate::server::handover`). Started by the running process, the successor is in the
//! same place it is: under systemd, the service's control group and sandbox, where
//! systemd accepts it as the new main process (`MAINPID=`, `crate::systemd`); a
//! successor started from a shell would be outside both.
//!
//! Only with `listener.handover_socket` set (no control socket: nothing to take over).
//! A successor that fails (a bad config, a certificate that does not load) exits
//! non-zero with its reason in the log, and this process serves on; its exit is logged.
//!
//! Must not: take the sockets over or drain (that is `server::handover` and `cli::run`).

use std::ffi::OsString;

/// The successor's command line: this process's own, `--take-over` added once.
fn successor_args(own: impl IntoIterator<Item = OsString>) -> Option<(OsString, Vec<OsString>)> {
    let mut own = own.into_iter();
    let program = own.next()?;
    let mut args: Vec<OsString> = own.filter(|a| a != "--take-over").collect();
    args.push("--take-over".into());
    Some((program, args))
}

/// Starts a successor on every `SIGUSR2`, until the future is dropped. The signal is
/// taken when this is called, not when the future first runs: the caller calls it before
/// it tells systemd it is ready, so a `SIGUSR2` sent at once never meets the default
/// action (the process killed; seen once in a loaded test run).
pub(super) fn on_sigusr2() -> impl std::future::Future<Output = ()> + Send + 'static {
    let signal = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined2());
    async move {
        let Ok(mut usr2) = signal else {
            tracing::warn!("SIGUSR2 unavailable: start `aipgw run --take-over` by hand to upgrade");
            return std::future::pending().await;
        };
        while usr2.recv().await.is_some() {
            start_successor();
        }
    }
}

fn start_successor() {
    let Some((program, args)) = successor_args(std::env::args_os()) else {
        return;
    };
    let started = std::process::Command::new(&program)
        .args(&args)
        .stdin(std::process::Stdio::null())
        .spawn();
    let mut child = match started {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(program = %program.to_string_lossy(), error = %e, "SIGUSR2: cannot start the successor: this process serves on");
            return;
        }
    };
    let pid = child.id();
    tracing::info!(pid, program = %program.to_string_lossy(), "SIGUSR2: started the successor (run --take-over)");
    // Reaped here if it exits while this process lives (a failed start); after this
    // process exits it is the system's.
    std::thread::spawn(move || match child.wait() {
        Ok(status) if status.success() => tracing::info!(pid, "the successor exited"),
        Ok(status) => {
            tracing::warn!(pid, %status, "the successor failed: this process serves on if it had not taken over")
        }
        Err(e) => tracing::warn!(pid, error = %e, "the successor could not be waited for"),
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn the_successor_runs_the_same_command_taking_over_once() {
        let (program, args) = successor_args(os(&[
            "/usr/local/bin/aipgw",
            "--log",
            "debug",
            "run",
            "-c",
            "/etc/a.toml",
        ]))
        .unwrap();
        assert_eq!(program, "/usr/local/bin/aipgw");
        assert_eq!(
            args,
            os(&["--log", "debug", "run", "-c", "/etc/a.toml", "--take-over"])
        );
        let (_, again) =
            successor_args(os(&["aipgw", "run", "--take-over", "-c", "a.toml"])).unwrap();
        assert_eq!(again, os(&["run", "-c", "a.toml", "--take-over"]));
        assert!(successor_args(Vec::new()).is_none());
    }
}
