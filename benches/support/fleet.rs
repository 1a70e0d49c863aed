//! The reload benches' fleet: a config of `n` Partners on one origin, the certificates it
//! names, and the bench thread's CPU time.

use std::path::{Path, PathBuf};
use std::time::Duration;

use aipgw::devcerts::{CertSpec, DevCa};

/// Writes the CA and the gateway's certificate and key the fleet configs name into `dir`.
pub(crate) fn certs(dir: &Path) {
    let ca = DevCa::new("bench CA").unwrap();
    let server = ca.issue(&CertSpec::server(&["localhost"])).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.cert_pem()).unwrap();
    std::fs::write(dir.join("gateway.pem"), &server.cert_pem).unwrap();
    std::fs::write(dir.join("gateway.key"), &server.key_pem).unwrap();
}

/// A config of `n` Partners in `dir` (each with `max_in_flight` and a quota).
pub(crate) fn fleet(dir: &Path, n: usize) -> PathBuf {
    let mut text = String::from(
        "[listener]\nbind = \"127.0.0.1:0\"\ncert = \"gateway.pem\"\nkey = \"gateway.key\"\nclient_ca = [\"ca.pem\"]\nmax_connections = 1000\n[runtime]\nworker_threads = 1\n[reload]\nwatch = false\n"
    );
    for i in 0..n {
        text.push_str(&format!(
            "[[partner]]\nname = \"p{i}\"\nprefix = \"/p{i}\"\nupstreams = [\"http://127.0.0.1:9000\"]\n[partner.limits]\nmax_in_flight = 100\nrate = 1000.0\n"
        ));
    }
    let path = dir.join(format!("fleet-{n}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// The calling thread's CPU time: a reload runs on the calling thread (the old snapshot's
/// frees included), and other work on a shared machine does not inflate it as it does
/// wall time.
pub(crate) fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}
