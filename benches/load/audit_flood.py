#!/usr/bin/env python3
"""The audit log under a refusal flood (benches/README.md, "The audit log on against off"):
a block-listed Leader's keep-alive requests, each refused (-32010) and each an audit
record, to the same release binary with [audit] off and on, rounds alternating. The
gateway on CPU 1, oha on CPU 0; refused requests per gateway CPU-second (utime+stime from
/proc, the audit writer's blocking-pool thread included).

    benches/load/audit_flood.py BINARY ROUNDS REQUESTS OUT_DIR

OUT_DIR gets the development certificates, an Ed25519 key (openssl) and the audit file
(verify it with `aipgw audit verify OUT_DIR/audit.log --key OUT_DIR/audit.pub`)."""
import json, os, subprocess, sys, time, statistics, socket
B = sys.argv[1]; rounds = int(sys.argv[2]); n = int(sys.argv[3]); D = sys.argv[4]
os.makedirs(D, exist_ok=True)
C = f"{D}/certs"
subprocess.run([B, "dev-certs", "--out", C], check=True, capture_output=True)
if not os.path.exists(f"{D}/audit.key"):
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", f"{D}/audit.key"], check=True)
    subprocess.run(["openssl", "pkey", "-in", f"{D}/audit.key", "-pubout", "-out", f"{D}/audit.pub"], check=True)
TCK = os.sysconf("SC_CLK_TCK")
BODY = '{"jsonrpc":"2.0","method":"rpc","id":1,"params":{"message":{"type":"message","id":"m1","sentAt":"2026-11-21T10:00:00+08:00","senderRole":"leader","senderId":"10001000011K912345E789ABCDEF2353","command":"start","dataItems":[{"type":"text","text":"hi"}],"taskId":"t1","sessionId":"s1"}}}'
open(f"{D}/rpc.json", "w").write(BODY)
def cfg(port, audit):
    a = f'[audit]\nfile = "{D}/audit.log"\nkey = "{D}/audit.key"\naic = "10001000011K9DX1GW14X1VSP2QQNG44"\nmax_file_bytes = 1073741824\n' if audit else ""
    p = f"{D}/gw-{port}.toml"
    open(p, "w").write(f'''[listener]
bind = "127.0.0.1:{port}"
cert = "{C}/gateway.pem"
key = "{C}/gateway.key"
client_ca = ["{C}/ca.pem"]
max_connections_per_ip = 10000
[runtime]
worker_threads = 1
[log]
level = "warn"
[reload]
watch = false
[admin]
bind = ""
[policy]
blocked = ["10001000011K912345E789ABCDEF2353"]
{a}
[[partner]]
name = "load"
prefix = "/aip"
upstreams = ["http://127.0.0.1:9"]
''')
    return p
def free():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p
def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TCK
res = {"off": [], "audit": []}
for r in range(rounds):
    for arm in (["off", "audit"] if r % 2 == 0 else ["audit", "off"]):
        port = free()
        proc = subprocess.Popen(["taskset", "-c", "1", B, "run", "--config", cfg(port, arm == "audit")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), 0.1).close(); break
            except OSError:
                time.sleep(0.05)
        c0 = cpu(proc.pid)
        out = subprocess.run(["taskset", "-c", "0", "oha", "--no-tui", "--output-format", "json", "-n", str(n), "-c", "16", "-m", "POST", "-T", "application/json", "-D", f"{D}/rpc.json",
            "--cacert", f"{C}/ca.pem", "--cert", f"{C}/leader-v1.pem", "--key", f"{C}/leader-v1.key", f"https://localhost:{port}/aip/rpc"], capture_output=True, text=True)
        c1 = cpu(proc.pid)
        j = json.loads(out.stdout)
        codes = j.get("statusCodeDistribution", {})
        got = sum(codes.values())
        proc.terminate(); proc.wait()
        res[arm].append(got / (c1 - c0))
        print(f"round {r} {arm}: {got} answers {codes}, {c1-c0:.2f} CPU s, {got/(c1-c0):,.0f} per CPU-s", flush=True)
off, on = statistics.median(res["off"]), statistics.median(res["audit"])
print(f"median refused per CPU-s: off {off:,.0f}, audit {on:,.0f}, audit/off {on/off:.2f}x")
