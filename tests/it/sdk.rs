//! The protocol's reference SDK (`acps-sdk` from the Python package index, AIP v2 only)
//! as the Leader, through the gateway to the demo Partner, with the committed development
//! certificates: what its `AipRpcClient` sends must pass and its answers must parse, and
//! the gateway's refusals must reach it as JSON-RPC errors.
//!
//! The SDK is installed at test time into a virtual environment under the target
//! directory (once; later runs reuse it). Without python3, its `venv` module or the
//! package index the test is skipped, except under `CI=true`, where it fails (`.ci/run`
//! installs python3 and its `venv` module).

use std::path::{Path, PathBuf};
use std::process::Command;

use aipgw::error::ErrorStatus;

use crate::demo::{demo_gateway, demo_partner};
use crate::support::*;

/// The SDK version the test pins.
const SDK: &str = "acps-sdk==2.1.0";

/// The Leader script: one line of JSON per step, an exception's text when one is raised.
const SCRIPT: &str = r#"
import asyncio, json, os, ssl, sys
from acps_sdk.aip.aip_rpc_client import AipRpcClient

def context(name):
    ctx = ssl.create_default_context(cafile=os.path.join(os.environ["CERTS"], "ca.pem"))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_cert_chain(os.path.join(os.environ["CERTS"], name + ".pem"),
                        os.path.join(os.environ["CERTS"], name + ".key"))
    return ctx

async def step(name, call):
    try:
        r = await call
        out = {"step": name, "state": r.status.state.value, "task": r.taskId,
               "sender": r.senderRole, "text": json.dumps(r.model_dump(mode="json"))}
    except Exception as e:
        out = {"step": name, "error": str(e)}
    print(json.dumps(out), flush=True)

async def main():
    for gw in ("default", "ok"):
        url = os.environ["URL_" + gw.upper()]
        owner = AipRpcClient(url, os.environ["OWNER_AIC"], context("leader-v2"))
        other = AipRpcClient(url, os.environ["OTHER_AIC"], context("leader-v1"))
        liar = AipRpcClient(url, os.environ["OTHER_AIC"], context("leader-v2"))
        task = "sdk-task-" + gw
        await step(gw + "/start", owner.start_task("sdk-session", "hello from the SDK", task))
        await step(gw + "/other_cancels", other.cancel_task(task, "sdk-session"))
        await step(gw + "/wrong_sender", liar.start_task("sdk-session", "not me", task + "-2"))
        await step(gw + "/complete", owner.complete_task(task, "sdk-session"))
        for c in (owner, other, liar):
            await c.http_client.aclose()

asyncio.run(main())
"#;

/// A python with the SDK, or `None` (skipped) when it cannot be had outside CI.
///
/// Two ways are tried with each interpreter (the one on `PATH`, then the system's): a
/// virtual environment made with its own pip (ensurepip), then one made without pip that
/// the interpreter's pip installs into (`pip --python`), for an interpreter whose
/// ensurepip fails. A half-made environment is removed before the next try, and what each
/// failed step printed is in the failure message.
fn sdk_python() -> Option<PathBuf> {
    python_with(&[SDK], "acps-sdk-venv", "acps_sdk.aip.aip_rpc_client")
}

/// A python in the virtual environment `venv_name` under the target directory with the
/// requirements `specs` installed (`module` importable), or `None` (skipped) when it
/// cannot be had outside CI (see [`sdk_python`]); `tests/it/a2a.rs` installs a2a-sdk
/// this way too.
pub(crate) fn python_with(specs: &[&str], venv_name: &str, module: &str) -> Option<PathBuf> {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join(venv_name);
    let python = venv.join("bin/python3");
    let ready = |python: &Path| {
        Command::new(python)
            .args(["-c", &format!("import {module}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if ready(&python) {
        return Some(python);
    }
    let venv_arg = venv.to_string_lossy();
    let python_arg = python.to_string_lossy();
    let pip = [
        &["install", "--quiet", "--disable-pip-version-check"][..],
        specs,
    ]
    .concat();
    let spec = specs.join(" ");
    let mut failed = Vec::new();
    for interpreter in ["python3", "/usr/bin/python3"] {
        let with_pip: [Vec<&str>; 2] = [
            vec![interpreter, "-m", "venv", &venv_arg],
            [&[&*python_arg, "-m", "pip"][..], &pip].concat(),
        ];
        let without_pip: [Vec<&str>; 2] = [
            vec![interpreter, "-m", "venv", "--without-pip", &venv_arg],
            [
                &[interpreter, "-m", "pip", "--python", &python_arg][..],
                &pip,
            ]
            .concat(),
        ];
        for steps in [with_pip, without_pip] {
            let _ = std::fs::remove_dir_all(&venv);
            if steps.iter().all(|step| succeeds(step, &mut failed)) && ready(&python) {
                return Some(python.clone());
            }
        }
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "cannot install {spec} into {venv_arg} (CI=true: .ci/run installs python3 and its \
         venv module); what failed:\n{}",
        failed.join("\n")
    );
    eprintln!("{spec} could not be installed: test skipped");
    None
}

/// Runs one command line; when it fails, notes it with the end of what it printed.
fn succeeds(line: &[&str], failed: &mut Vec<String>) -> bool {
    let shown = line.join(" ");
    match Command::new(line[0]).args(&line[1..]).output() {
        Ok(out) if out.status.success() => true,
        Ok(out) => {
            let err = String::from_utf8_lossy(&out.stderr);
            let mut tail: Vec<&str> = err.lines().rev().take(6).collect();
            tail.reverse();
            failed.push(format!("{shown}: {}: {}", out.status, tail.join(" | ")));
            false
        }
        Err(e) => {
            failed.push(format!("{shown}: {e}"));
            false
        }
    }
}

#[tokio::test]
async fn the_reference_sdk_leads_through_the_gateway() {
    let Some(python) = tokio::task::spawn_blocking(sdk_python).await.unwrap() else {
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let partner = demo_partner().await;
    // The demo's gateway as it is (refusals with their HTTP status: 403 for -32009) and
    // with `listener.error_status = "ok"` (every refusal whose status means nothing more
    // as HTTP 200), which the SDK reads as a JSON-RPC error.
    let mut urls = Vec::new();
    for mode in [ErrorStatus::Mapped, ErrorStatus::Ok] {
        let addr = demo_gateway(partner, |c| c.listener.error_status = mode).await;
        urls.push(format!(
            "https://localhost:{}/partners/demo/rpc",
            addr.port()
        ));
    }

    let mut script = Command::new(&python);
    script
        .args(["-c", SCRIPT])
        .env("URL_DEFAULT", &urls[0])
        .env("URL_OK", &urls[1])
        .env("CERTS", root.join("certs"))
        .env("OWNER_AIC", LEADER_B)
        .env("OTHER_AIC", LEADER_A);
    // Each of the SDK's requests has its own 30 s timeout.
    let run = tokio::task::spawn_blocking(move || script.output());
    let out = within(150, run).await.unwrap().expect("the SDK script ran");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let steps: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let step = |name: &str| {
        steps
            .iter()
            .find(|s| s["step"] == name)
            .unwrap_or_else(|| panic!("no step {name}: {stdout}"))
    };

    for gw in ["default", "ok"] {
        // Its start passes the gateway's checks and the demo Partner's TaskResult parses
        // in the SDK's own models.
        let start = step(&format!("{gw}/start"));
        assert_eq!(
            (&start["state"], &start["task"], &start["sender"]),
            (
                &serde_json::json!("awaiting-completion"),
                &serde_json::json!(format!("sdk-task-{gw}")),
                &serde_json::json!("partner")
            ),
            "{start}"
        );
        let error = |name: &str| {
            step(&format!("{gw}/{name}"))["error"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        };
        // Another Leader may not cancel the task, and a senderId other than the
        // certificate's AIC is refused. The SDK raises on any status but 2xx before it
        // reads the body, so by default it reports the HTTP status with the gateway's
        // JSON-RPC error; under `error_status = "ok"` it reads the error itself.
        let (other, liar) = (error("other_cancels"), error("wrong_sender"));
        if gw == "default" {
            assert!(
                other.starts_with("HTTP Error: 403 - ")
                    && other.contains("\"code\":-32009")
                    && other.contains("not_task_owner"),
                "{other}"
            );
            assert!(
                liar.starts_with("HTTP Error: 403 - ") && liar.contains("sender_mismatch"),
                "{liar}"
            );
        } else {
            assert_eq!(other, "RPC Error: -32009 - Authorization failed");
            assert_eq!(liar, "RPC Error: -32009 - Authorization failed");
        }
        // The owner completes it.
        assert_eq!(
            step(&format!("{gw}/complete"))["state"],
            "completed",
            "{stdout}"
        );
    }
}
