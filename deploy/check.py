#!/usr/bin/env python3
"""Checks the deployment files under deploy/ (run by .ci/run; README.md, "systemd" and
"Kubernetes").

  check.py systemd    [--binary PATH]   systemd-analyze verify (the service and its socket
                                        units) and security, sysusers
  check.py kubernetes [--binary PATH]   schemas, the kustomization's list, the manifests
                                        against each other, and the ConfigMap's config run
                                        by the gateway from folders laid out as the kubelet
                                        lays out ConfigMap and Secret volumes, through
                                        certificate and config swaps

`kubernetes` needs PyYAML and kubernetes-validate (.ci/run installs them in a virtual
environment). PATH is the gateway binary (default target/debug/aipgw), built with the
`dev` feature for its certificate generator.
"""

import argparse
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SYSTEMD = ROOT / "deploy/systemd"
KUBE = ROOT / "deploy/kubernetes"
# The unit's ExecStart binary; verify needs it to exist, so a copy points at the build.
UNIT_BINARY = "/usr/local/bin/aipgw"
# The socket units (socket activation, README.md "systemd"), verified beside the service.
SOCKETS = ["aipgw.socket", "aipgw-admin.socket"]
# The highest exposure `systemd-analyze security --offline=yes` may give (README.md).
EXPOSURE_MAX = {"aipgw.service": 1.4, "aipgw.service + low-port.conf": 1.5}
# The Kubernetes versions the manifests are validated for: the oldest they need (the
# preStop sleep action is on by default from 1.30) and the newest the tool knows.
K8S_VERSIONS = ["1.30.0", "1.37.0"]
# What stands in for each Secret the Deployment mounts: key -> development file.
DEV_SECRETS = {
    "aipgw-server-tls": {"tls.crt": "certs/gateway.pem", "tls.key": "certs/gateway.key"},
    "aipgw-client-ca": {"ca.pem": "certs/ca.pem", "crl.pem": "certs/crl.pem"},
}
# Kinds whose schema comes with a CRD, not Kubernetes: checked against the manifests only.
CRD_KINDS = {
    ("cert-manager.io/v1", "Certificate"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
}

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)
    return ok


def seconds(text):
    """A humantime duration in whole seconds ("30s", "2m")."""
    m = re.fullmatch(r"(\d+)(ms|s|m|h)", text)
    if not m:
        raise ValueError(f"not a duration: {text}")
    n, unit = int(m[1]), m[2]
    return {"ms": n / 1000, "s": n, "m": 60 * n, "h": 3600 * n}[unit]


def default_drain_timeout():
    """listener.drain_timeout's default, read from its serde attribute."""
    raw = (ROOT / "src/config/raw/mod.rs").read_text()
    m = re.search(r'default = "d(\d+)([smh])"[^\n]*\n\s*pub drain_timeout', raw)
    return seconds(m[1] + m[2])


# ---------------------------------------------------------------- systemd


def systemd(binary):
    analyze = shutil.which("systemd-analyze")
    if not analyze:
        print("skip systemd: no systemd-analyze on this machine")
        return
    unit = (SYSTEMD / "aipgw.service").read_text()
    stop = re.search(r"^TimeoutStopSec=(\S+)$", unit, re.M)
    drain = default_drain_timeout()
    check(stop and seconds(stop[1]) > drain + 2,
          f"TimeoutStopSec ({stop and stop[1]}) above the default drain_timeout ({drain}s) + 2s")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "aipgw.service").write_text(unit.replace(UNIT_BINARY, str(binary)))
        runs = [("aipgw.service", None),
                ("aipgw.service + low-port.conf", SYSTEMD / "aipgw.service.d")]
        for name, dropins in runs:
            if dropins:
                shutil.copytree(dropins, tmp / "aipgw.service.d")
            r = subprocess.run([analyze, "verify", "aipgw.service"], cwd=tmp,
                               capture_output=True, text=True)
            said = (r.stdout + r.stderr).strip()
            check(r.returncode == 0 and not said, f"systemd-analyze verify {name}: {said or 'clean'}")
            r = subprocess.run([analyze, "security", "--offline=yes", "aipgw.service"],
                               cwd=tmp, capture_output=True, text=True)
            if "offline" in r.stderr and r.returncode != 0:
                print(f"skip security: this systemd-analyze has no --offline ({r.stderr.strip()})")
                continue
            m = re.search(r"Overall exposure level for aipgw.service: (\d+\.\d+)", r.stdout)
            score = float(m[1]) if m else None
            check(score is not None and score <= EXPOSURE_MAX[name],
                  f"systemd-analyze security --offline=yes {name}: exposure {score} "
                  f"(at most {EXPOSURE_MAX[name]})")
        # The socket units (socket activation), beside the service they name.
        for sock in SOCKETS:
            shutil.copy(SYSTEMD / sock, tmp / sock)
            r = subprocess.run([analyze, "verify", sock], cwd=tmp, capture_output=True, text=True)
            said = (r.stdout + r.stderr).strip()
            check(r.returncode == 0 and not said, f"systemd-analyze verify {sock}: {said or 'clean'}")
            text = (SYSTEMD / sock).read_text()
            name = re.search(r"^FileDescriptorName=(\S+)$", text, re.M)
            check(name and name[1] in ("listener", "admin") and
                  re.search(r"^Service=aipgw\.service$", text, re.M),
                  f"{sock} names its socket listener or admin and passes it to aipgw.service")
    sysusers = shutil.which("systemd-sysusers")
    if not sysusers:
        print("skip sysusers: no systemd-sysusers on this machine")
        return
    with tempfile.TemporaryDirectory() as root:
        (Path(root) / "etc").mkdir()
        r = subprocess.run([sysusers, f"--root={root}", str(SYSTEMD / "aipgw.sysusers")],
                           capture_output=True, text=True)
        passwd = (Path(root) / "etc/passwd").read_text() if r.returncode == 0 else ""
        check(re.search(r"^aipgw:x:\d+:\d+:[^:]*:/:/usr/sbin/nologin$", passwd, re.M),
              f"systemd-sysusers makes user aipgw: {passwd.strip() or r.stderr.strip()}")


# ---------------------------------------------------------------- Kubernetes


def kubernetes(binary):
    import yaml
    from kubernetes_validate import utils as kv

    kust = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
    listed = kust.get("resources", [])
    present = sorted(p.name for p in KUBE.iterdir()
                     if p.suffix in (".yaml", ".yml") and p.name != "kustomization.yaml")
    check(sorted(listed) == present,
          f"kustomization.yaml lists every manifest in deploy/kubernetes: {listed} vs {present}")

    docs = []
    for name in listed:
        for doc in yaml.safe_load_all((KUBE / name).read_text()):
            if not doc:
                continue
            docs.append(doc)
            what = f"{name}: {doc['kind']}/{doc['metadata']['name']}"
            for version in K8S_VERSIONS:
                try:
                    kv.validate(doc, version, strict=True)
                    check(True, f"{what} valid for Kubernetes {version}")
                except (kv.ValidationError, kv.SchemaNotFoundError, kv.InvalidSchemaError) as e:
                    where = ".".join(str(p) for p in getattr(e, "path", []))
                    check(False, f"{what} for Kubernetes {version}: {where}: {e.message}")
    optional = []
    for path in sorted((KUBE / "optional").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                optional.append(doc)
                check((doc["apiVersion"], doc["kind"]) in CRD_KINDS,
                      f"optional/{path.name}: {doc['apiVersion']} {doc['kind']} is a known CRD kind")

    def one(kind):
        found = [d for d in docs if d["kind"] == kind]
        check(len(found) >= 1, f"a {kind} is deployed")
        return found[0] if found else None

    deploy, cm = one("Deployment"), one("ConfigMap")
    if not (deploy and cm):
        return
    pod = deploy["spec"]["template"]["spec"]
    ctr = pod["containers"][0]
    cfg = tomllib.loads(cm["data"]["aipgw.toml"])
    ports = {p["name"]: p["containerPort"] for p in ctr["ports"]}
    check(cfg["listener"]["bind"].endswith(f":{ports['https']}"),
          f"listener.bind {cfg['listener']['bind']} is containerPort https ({ports['https']})")
    check(cfg["admin"]["bind"].endswith(f":{ports['admin']}"),
          f"admin.bind {cfg['admin']['bind']} is containerPort admin ({ports['admin']})")
    check(ctr["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
          and ctr["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"},
          "liveness probes /healthz, readiness /readyz, on the admin port")
    drain = seconds(cfg["listener"].get("drain_timeout", f"{default_drain_timeout()}s"))
    pre = ctr["lifecycle"]["preStop"]["sleep"]["seconds"]
    grace = pod["terminationGracePeriodSeconds"]
    check(grace > pre + drain + 2,
          f"terminationGracePeriodSeconds ({grace}) above preStop ({pre}s) + drain_timeout ({drain}s) + 2s")
    uid = re.search(r"--uid (\d+)", (ROOT / "Dockerfile").read_text())[1]
    check(str(pod["securityContext"]["runAsUser"]) == uid,
          f"runAsUser is the image's user ({uid})")
    # Every file the config names is in a mounted volume.
    mounts = {m["mountPath"]: m["name"] for m in ctr["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    named = [cfg["listener"]["cert"], cfg["listener"]["key"], *cfg["listener"]["client_ca"],
             *cfg["listener"].get("crl", [])]
    for f in named:
        check(any(f.startswith(m + "/") for m in mounts), f"{f} is in a mounted volume")
    secrets = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    for doc in optional:
        if doc["kind"] == "Certificate":
            check(doc["spec"]["secretName"] in secrets,
                  f"the Certificate's Secret {doc['spec']['secretName']} is mounted")
        if doc["kind"] == "ServiceMonitor":
            want = doc["spec"]["selector"]["matchLabels"]
            svcs = [d for d in docs if d["kind"] == "Service"
                    and want.items() <= d["metadata"].get("labels", {}).items()]
            names = {p["name"] for s in svcs for p in s["spec"]["ports"]}
            check(len(svcs) == 1 and doc["spec"]["endpoints"][0]["port"] in names,
                  f"the ServiceMonitor selects one Service with port {doc['spec']['endpoints'][0]['port']}")
    if binary is None:
        print("skip running the ConfigMap's config: no gateway binary")
        return
    with tempfile.TemporaryDirectory() as tmp:
        run_as_kubelet_lays_out(Path(tmp), binary, cm, mounts, volumes)


class Volume:
    """A folder laid out as the kubelet lays out a ConfigMap or Secret volume: the files
    in a timestamped folder, `..data` a symlink to it, each key a symlink through
    `..data`; an update writes a new folder and renames a new `..data` over the old."""

    def __init__(self, path, files):
        self.path, self.n = path, 0
        path.mkdir(parents=True)
        self.update(files)

    def update(self, files):
        self.n += 1
        new = f"..2026_01_01_00_00_{self.n:02}.{os.getpid()}"
        (self.path / new).mkdir()
        for key, data in files.items():
            (self.path / new / key).write_bytes(data)
        old = os.readlink(self.path / "..data") if (self.path / "..data").exists() else None
        os.symlink(new, self.path / "..data_tmp")
        os.rename(self.path / "..data_tmp", self.path / "..data")
        for key in files:
            if not (self.path / key).is_symlink():
                os.symlink(f"..data/{key}", self.path / key)
        if old:
            shutil.rmtree(self.path / old)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metric(admin, name):
    with urllib.request.urlopen(f"http://{admin}/metrics", timeout=2) as r:
        text = r.read().decode()
    m = re.search("^" + re.escape(name) + r" (\d+)", text, re.M)
    return int(m[1]) if m else 0


def wait_for(what, cond, deadline=20.0):
    """Polls `cond` until it holds or `deadline` seconds pass."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        try:
            if cond():
                return check(True, what)
        except OSError:
            pass
        time.sleep(0.1)
    return check(False, what + f" (not within {deadline}s)")


def served_cert(addr):
    host, port = addr.rsplit(":", 1)
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection((host, int(port)), timeout=5) as s:
        with ctx.wrap_socket(s) as t:
            return t.getpeercert(binary_form=True)


def first_der(pem_bytes):
    block = re.search(rb"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----",
                      pem_bytes, re.S)[0]
    return ssl.PEM_cert_to_DER_cert(block.decode())


def run_as_kubelet_lays_out(tmp, binary, cm, mounts, volumes):
    """The ConfigMap's config, run by the gateway from kubelet-style volumes (binds moved
    to free loopback ports, mount paths to folders here); a cert-manager renewal (the
    server Secret swapped) and a ConfigMap edit must each reload it."""
    gw, admin = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    text = cm["data"]["aipgw.toml"]
    text = re.sub(r'(?m)^bind = "0\.0\.0\.0:8443"', f'bind = "{gw}"', text)
    text = re.sub(r'(?m)^bind = "0\.0\.0\.0:9901"', f'bind = "{admin}"', text)
    for path in sorted(mounts, key=len, reverse=True):
        text = text.replace(f'"{path}/', f'"{tmp}/{mounts[path]}/')
    vols = {}
    for path, name in mounts.items():
        v = volumes[name]
        if "configMap" in v:
            vols[name] = Volume(tmp / name, {"aipgw.toml": text.encode()})
        else:
            dev = DEV_SECRETS.get(v["secret"]["secretName"])
            if not check(dev is not None, f"Secret {v['secret']['secretName']} has development files in check.py"):
                return
            vols[name] = Volume(tmp / name, {k: (ROOT / f).read_bytes() for k, f in dev.items()})
    cfgvol = next(n for n, v in volumes.items() if "configMap" in v)
    config = tmp / cfgvol / "aipgw.toml"
    r = subprocess.run([str(binary), "check", "--config", str(config)], capture_output=True, text=True)
    if not check(r.returncode == 0, f"aipgw check loads the ConfigMap's config: {(r.stdout + r.stderr).strip()}"):
        return
    fresh = tmp / "renewed"
    subprocess.run([str(binary), "dev-certs", "--out", str(fresh)], check=True, capture_output=True)
    server = next(n for n, v in volumes.items()
                  if v.get("secret", {}).get("secretName") == "aipgw-server-tls")
    log = open(tmp / "gateway.log", "w")
    proc = subprocess.Popen([str(binary), "run", "--config", str(config)], stdout=log, stderr=log)
    try:
        ok = wait_for("the gateway from the ConfigMap's config gets ready",
                      lambda: urllib.request.urlopen(f"http://{admin}/readyz", timeout=2).status == 200)
        ok = ok and check(served_cert(gw) == first_der((ROOT / "certs/gateway.pem").read_bytes()),
                          "it serves the Secret's certificate")
        reloads = 'aipgw_config_reloads_total{result="ok"}'
        for n, (pem, key) in enumerate([(fresh / "gateway.pem", fresh / "gateway.key"),
                                        (ROOT / "certs/gateway.pem", ROOT / "certs/gateway.key")]):
            if not ok:
                break
            vols[server].update({"tls.crt": pem.read_bytes(), "tls.key": key.read_bytes()})
            ok = wait_for(f"Secret swap {n + 1} (a renewal) reloads", lambda: metric(admin, reloads) >= n + 1)
            ok = ok and check(served_cert(gw) == first_der(pem.read_bytes()),
                              f"new handshakes get the certificate of swap {n + 1}")
        if ok:
            vols[cfgvol].update({"aipgw.toml": (text + "\n# edited\n").encode()})
            wait_for("a ConfigMap swap reloads", lambda: metric(admin, reloads) >= 3)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()
        if failures:
            print((tmp / "gateway.log").read_text()[-4000:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["systemd", "kubernetes"])
    ap.add_argument("--binary", type=Path, default=ROOT / "target/debug/aipgw")
    args = ap.parse_args()
    binary = args.binary.resolve() if args.binary.is_file() else None
    if binary is None and os.environ.get("CI") == "true":
        check(False, f"the gateway binary {args.binary} exists (CI=true)")
    elif binary is None:
        print(f"skip what needs the gateway binary: no {args.binary}")
    if args.what == "systemd":
        systemd(binary or Path(shutil.which("true")))
    else:
        kubernetes(binary)
    print(f"deploy check {args.what}: {len(failures)} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
