#!/usr/bin/env python3
"""The load comparison: aipgw beside NGINX, HAProxy and a bare tokio + hyper + rustls
proxy, on the same mutual-TLS 1.3 traffic (client certificate and CRL checked by every
proxy), each proxy on one worker pinned to one core, oha and the static backend on the
other. Rounds alternate the order; each proxy's CPU time is read from /proc.

    benches/load/run.py --http1 --http2 --handshake --resume --sse [--rounds 3] [--duration 10]

Modes: --http1 (keep-alive), --http2, --handshake (a new connection per request, full
handshakes: resumption off on every proxy), --resume (a new connection per request,
TLS 1.3 resumption on), --sse (events per CPU-second through `stream` answers of
--events events each). Without a mode, --http1 and --http2.

--revocation measures, beside aipgw, the same binary with revocation on: the dev CA's
CRL fetched over HTTP (python3 -m http.server) and OCSP (`soft`) asked of `openssl ocsp`
for the Leader's certificate, its answer cached (issue 31: full handshakes per
CPU-second with it on against off).

--otlp measures, beside aipgw, the same binary with OTLP trace export at ratio 1.0 to a live
receiver (examples/otlp_sink) and to a dead one (issue 34: keep-alive requests per
CPU-second with export on against off).

--gateway LABEL=PATH (repeatable) measures other aipgw binaries beside the default one
(e.g. allocator builds); --only NAMES limits the proxies (aipgw,nginx,haproxy,bare).

Fleet modes (issue 38), keep-alive HTTP/1.1 to each gateway binary only, one gateway per
size, the ratios to the first size printed per binary:
--routes 1,1000,10000: N Partners (N - 1 HTTP/2 ones that take no traffic, then the
target), every prefix `/aip/pNNNNN`, the load sent to the last;
--access 10,1000,100000: the target Partner's `[partner.access]` with N allow prefixes
(the Leader's agent serial last) and N deny prefixes that do not match.

--instructions N (issue 33): user-space instructions per keep-alive request for every
proxy, counted under valgrind (callgrind) over N and then 3N requests sent one at a
time, the serving thread's difference divided by 2N: a figure the machine's load does not
move (benches/load/instructions.py). CALLGRIND_KEEP=DIR keeps the callgrind files.

--idle N (issue 33): memory per held idle keep-alive mTLS connection, for every proxy:
N HTTP/1.1 connections opened, one `rpc` answered on each, all held idle; the proxy's
RSS before and --idle-settle seconds after (past the gateway's
`listener.idle_release_after`), per held connection, a fresh proxy per round
(`benches/load/idle.py`).

--proxy-protocol (issue 37): each gateway binary behind the same L4 front, HAProxy in TCP
mode pinned to the load generator's core (oha cannot send a PROXY header), in two arms
side by side: the front forwarding plain TCP, and the front with `send-proxy-v2` and the
gateway's `[listener.proxy_protocol] mode = "required"`. Keep-alive HTTP/1.1 and a new
connection per request (full handshakes); the gateway's CPU per request is compared, the
ratio of the PROXY arm to the plain one printed per binary.

Needs oha (`cargo install oha --locked`), nginx and haproxy (`apt-get install -y
nginx-light haproxy`), and taskset; `--install` installs what is missing. Figures go in
benches/README.md ("Load comparison") with the date and the machine.
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RELEASE = ROOT / "target" / "release"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PROXY_CPU = "1"
LOAD_CPU = "0"

# A ~400-byte AIP v01.00 `rpc` (the backend answers id 1).
RPC_BODY = (
    '{"jsonrpc":"2.0","method":"rpc","id":1,"params":{"message":{"type":"message",'
    '"id":"m-load-0001","sentAt":"2026-11-21T10:00:00+08:00","senderRole":"leader",'
    '"senderId":"10001000011K912345E789ABCDEF2353","command":"start","dataItems":'
    '[{"type":"text","text":"Plan a three-day trip to the coast for two adults, '
    'trains only, mid-range hotels."}],"taskId":"task-load-0001","sessionId":"session-load-01"}}}'
)
STREAM_BODY = (
    '{"jsonrpc":"2.0","method":"stream","id":1,"params":{"message":{"type":"message",'
    '"id":"m-load-0002","sentAt":"2026-11-21T10:00:00+08:00","senderRole":"leader",'
    '"senderId":"10001000011K912345E789ABCDEF2353","command":"start","taskId":'
    '"task-load-stream","sessionId":"session-load-01"}}}'
)


def die(msg):
    print(f"load: {msg}", file=sys.stderr)
    sys.exit(2)


def find_oha():
    for cand in [shutil.which("oha"), str(Path.home() / ".cargo/bin/oha")]:
        if cand and Path(cand).exists():
            return cand
    return None


def ensure_tools(install):
    missing = []
    if not find_oha():
        missing.append(("oha", ["cargo", "install", "oha", "--locked"]))
    for tool, pkg in [("nginx", "nginx-light"), ("haproxy", "haproxy")]:
        if not shutil.which(tool) and not Path(f"/usr/sbin/{tool}").exists():
            missing.append((tool, ["apt-get", "install", "-y", pkg]))
    if not shutil.which("taskset"):
        missing.append(("taskset", ["apt-get", "install", "-y", "util-linux"]))
    for tool, cmd in missing:
        if not install:
            die(f"{tool} is missing: {' '.join(cmd)} (or run with --install)")
        print(f"load: installing {tool}: {' '.join(cmd)}", file=sys.stderr)
        subprocess.run(cmd, check=True)


def tool(name):
    return shutil.which(name) or f"/usr/sbin/{name}"


def free_port():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# A command the proxies are started under (--instructions: valgrind), empty otherwise.
WRAP = []


class Proc:
    """A started server, pinned to a core; `cpu()` is its user+system seconds."""

    def __init__(self, name, argv, cpu, log_dir, wait_port=None, stdin=None, start_wait=10):
        self.name = name
        self.prefix = "/aip"
        log = open(log_dir / f"{name}.log", "w")
        self.p = subprocess.Popen(
            ["taskset", "-c", cpu] + WRAP + argv,
            stdout=subprocess.PIPE if wait_port is None else log,
            stderr=log,
            stdin=stdin,
            text=True,
        )
        self.port = wait_port
        if wait_port is None:
            line = self.p.stdout.readline()
            if "listening on" not in line:
                die(f"{name} did not start (see {log_dir / (name + '.log')})")
            self.port = int(line.rsplit(":", 1)[1])
        else:
            wait_listening(wait_port, name, log_dir, start_wait)

    def cpu(self):
        user, system = self.times()
        return user + system

    def times(self):
        """(user, system) CPU seconds so far, all threads."""
        fields = Path(f"/proc/{self.p.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK

    def stop(self, wait=5):
        front = getattr(self, "front", None)
        if front is not None:
            front.stop()
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(wait)
            except subprocess.TimeoutExpired:
                self.p.kill()


def wait_listening(port, name, log_dir, seconds=10):
    import socket

    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    die(f"{name} is not listening on {port} (see {log_dir / (name + '.log')})")


class Fleet:
    """A fleet mode's config for one gateway: Partners before the target, the target's
    prefix and its own extra TOML (an access list), and the binary's own extra TOML."""

    def __init__(self, kind, n, extra=""):
        self.kind, self.n, self.extra = kind, n, extra
        self.before, self.prefix, self.target = "", "/aip", ""
        if kind == "routes":
            # Equal lengths: the table keeps config order among them, the target last.
            self.before = "".join(
                f'[[partner]]\nname = "p{i:05}"\nprefix = "/aip/p{i:05}"\n'
                f'upstreams = ["http://127.0.0.1:9"]\nhttp2 = true\n'
                for i in range(n - 1)
            )
            self.prefix = f"/aip/p{n - 1:05}"
        elif kind == "access":
            # Agent serial prefixes (22 characters) of providers 0001 and 0002; the
            # Leader's (10001000011K912345E789ABCDEF2353) is the last allow entry.
            allow = [f'"10001000011K9{i:09}*"' for i in range(n - 1)]
            allow.append('"10001000011K912345E789*"')
            deny = [f'"10002000011K9{i:09}*"' for i in range(n)]
            self.target = f"[partner.access]\nallow = [{','.join(allow)}]\ndeny = [{','.join(deny)}]\n"
        else:
            die(f"unknown fleet mode {kind}")


class Front:
    """--proxy-protocol: the gateway behind an L4 HAProxy (TCP mode) on the load's core;
    `v2`: the front sends a PROXY v2 header and the gateway requires one."""

    def __init__(self, v2, extra=""):
        self.v2, self.extra = v2, extra

    def gateway_toml(self):
        if not self.v2:
            return self.extra
        return self.extra + '\n[listener.proxy_protocol]\nmode = "required"\nfrom = ["127.0.0.1/32"]\n'


def front_config(d, port, gateway, v2):
    """HAProxy in TCP mode, one thread: `port` -> the gateway (with `send-proxy-v2`)."""
    path = d / f"front-{port}.cfg"
    send = " send-proxy-v2" if v2 else ""
    path.write_text(
        f"""
global
    nbthread 1
    maxconn 8192

defaults
    mode tcp
    timeout connect 5s
    timeout client 60s
    timeout server 60s

frontend l4
    bind 127.0.0.1:{port}
    default_backend gw

backend gw
    server gw 127.0.0.1:{gateway}{send}
"""
    )
    return path


def aipgw_config(d, port, backend, resumption, extra="", runtime="worker_threads = 1", fleet=None):
    path = d / f"aipgw-{port}.toml"
    # A fleet's Partners need descriptors of their own (HTTP/2 ones: one each), which the
    # open-file check counts beside max_connections: 1,000 client connections then.
    max_conns = 1000 if fleet else 10000
    before, prefix, target = (fleet.before, fleet.prefix, fleet.target) if fleet else ("", "/aip", "")
    path.write_text(
        f"""
[listener]
bind = "127.0.0.1:{port}"
cert = "{d}/gateway.pem"
key = "{d}/gateway.key"
client_ca = ["{d}/ca.pem"]
crl = ["{d}/crl.pem"]
tls_session_cache = {256 if resumption else 0}
max_connections = {max_conns}
# Every client is on loopback: one source address.
max_connections_per_ip = {max_conns}

[runtime]
{runtime}

[log]
level = "warn"

[reload]
watch = false

[admin]
bind = "127.0.0.1:{free_port()}"

{before}
[[partner]]
name = "load"
prefix = "{prefix}"
upstreams = ["http://127.0.0.1:{backend}"]
{target}
{extra}
"""
    )
    return path


def nginx_config(d, port, backend, resumption):
    path = d / f"nginx-{port}.conf"
    sessions = (
        "ssl_session_cache shared:SSL:10m; ssl_session_tickets on;"
        if resumption
        else "ssl_session_cache off; ssl_session_tickets off;"
    )
    path.write_text(
        f"""
worker_processes 1;
master_process off;
daemon off;
pid {d}/nginx-{port}.pid;
error_log {d}/nginx-error.log warn;
events {{ worker_connections 10000; }}
http {{
    access_log off;
    # nginx closes a client connection after 1,000 requests by default (HTTP/1.1 and
    # HTTP/2), which the other proxies never do: lift it, upstream too.
    keepalive_requests 1000000;
    client_body_temp_path {d}/nginx-body;
    proxy_temp_path {d}/nginx-proxy;
    upstream backend {{ server 127.0.0.1:{backend}; keepalive 64; keepalive_requests 1000000; }}
    server {{
        listen 127.0.0.1:{port} ssl http2;
        ssl_protocols TLSv1.3;
        ssl_certificate {d}/gateway.pem;
        ssl_certificate_key {d}/gateway.key;
        ssl_client_certificate {d}/ca.pem;
        ssl_verify_client on;
        ssl_crl {d}/crl.pem;
        {sessions}
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
}}
"""
    )
    return path


def haproxy_config(d, port, backend, resumption, threads=1):
    path = d / f"haproxy-{port}.cfg"
    crt = d / "gateway-haproxy.pem"
    crt.write_text((d / "gateway.pem").read_text() + (d / "gateway.key").read_text())
    tickets = "" if resumption else " no-tls-tickets"
    cache = "" if resumption else "    tune.ssl.cachesize 0\n"
    path.write_text(
        f"""
global
    nbthread {threads}
    maxconn 4096
{cache}
defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    option http-keep-alive
    http-reuse always

frontend fe
    bind 127.0.0.1:{port} ssl crt {crt} ca-file {d}/ca.pem verify required crl-file {d}/crl.pem ssl-min-ver TLSv1.3 alpn h2,http/1.1{tickets}
    default_backend be

backend be
    server s1 127.0.0.1:{backend}
"""
    )
    return path


# --scaling: the gateway with one worker on one core beside two workers on both cores
# (the load generator then shares a core with one of them); equal requests per CPU-second
# mean two workers do twice the work of one. HAProxy (one process, one thread per core)
# the same way, as the reference for what sharing the cores with the load costs any proxy.
SCALING = {
    "1 worker, CPU 1": ("1", "worker_threads = 1"),
    "2 workers, CPUs 0-1": ("0,1", "worker_threads = 2"),
    "2 shared, CPUs 0-1": ("0,1", 'worker_threads = 2\nscheduler = "shared"'),
}
HAPROXY_SCALING = {
    "haproxy 1 thread, CPU 1": ("1", 1),
    "haproxy 2 threads, CPUs 0-1": ("0,1", 2),
}


def start_proxy(name, binary, d, backend, resumption, extra="", start_wait=10):
    port = free_port()
    if name in HAPROXY_SCALING:
        cpus, threads = HAPROXY_SCALING[name]
        config = haproxy_config(d, port, backend, resumption, threads)
        return Proc(name, [tool("haproxy"), "-db", "-f", str(config)], cpus, d, wait_port=port)
    if name in SCALING:
        cpus, runtime = SCALING[name]
        config = aipgw_config(d, port, backend, resumption, extra, runtime)
        return Proc(name, [binary, "run", "--config", str(config)], cpus, d, wait_port=port)
    if name == "nginx":
        argv = [tool("nginx"), "-c", str(nginx_config(d, port, backend, resumption))]
        return Proc(name, argv, PROXY_CPU, d, wait_port=port, start_wait=start_wait)
    if name == "haproxy":
        argv = [tool("haproxy"), "-db", "-f", str(haproxy_config(d, port, backend, resumption))]
        return Proc(name, argv, PROXY_CPU, d, wait_port=port, start_wait=start_wait)
    if name == "bare":
        argv = [
            str(RELEASE / "examples" / "bare_proxy"),
            "--listen", f"127.0.0.1:{port}",
            "--backend", f"http://127.0.0.1:{backend}",
            "--cert", str(d / "gateway.pem"), "--key", str(d / "gateway.key"),
            "--ca", str(d / "ca.pem"), "--crl", str(d / "crl.pem"),
        ] + ([] if resumption else ["--no-resumption"])
        return Proc(name, argv, PROXY_CPU, d, start_wait=start_wait)
    if isinstance(extra, Front):
        config = aipgw_config(d, port, backend, resumption, extra.gateway_toml())
        proc = Proc(name, [binary, "run", "--config", str(config)], PROXY_CPU, d, wait_port=port, start_wait=start_wait)
        front_port = free_port()
        argv = [tool("haproxy"), "-db", "-f", str(front_config(d, front_port, port, extra.v2))]
        proc.front = Proc(f"{name}-front", argv, LOAD_CPU, d, wait_port=front_port)
        # The load goes to the front; the CPU measured is still the gateway's.
        proc.port = front_port
        return proc
    if isinstance(extra, Fleet):
        config = aipgw_config(d, port, backend, resumption, extra.extra, fleet=extra)
        proc = Proc(name, [binary, "run", "--config", str(config)], PROXY_CPU, d, wait_port=port, start_wait=start_wait)
        proc.prefix = extra.prefix
        return proc
    config = aipgw_config(d, port, backend, resumption, extra)
    proc = Proc(name, [binary, "run", "--config", str(config)], PROXY_CPU, d, wait_port=port, start_wait=start_wait)
    proc.config = config
    return proc


def span_counts(proc):
    """--otlp: the gateway's trace_spans_* counters from its admin /metrics (the port read
    from its config), or "" for a gateway without [tracing]."""
    config = getattr(proc, "config", None)
    if config is None or "[tracing]" not in config.read_text():
        return ""
    import urllib.request
    admin = [l for l in config.read_text().splitlines() if l.startswith("bind = ") and "127.0.0.1" in l]
    addr = admin[-1].split('"')[1]
    text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=5).read().decode()
    return ", ".join(l for l in text.splitlines() if l.startswith("aipgw_trace_spans_"))


# --rate: requests per second oha sends (0: as many as it can).
RATE = 0


def oha(d, port, mode, duration, conns, prefix="/aip"):
    body = d / ("stream.json" if mode == "sse" else "rpc.json")
    argv = [
        "taskset", "-c", LOAD_CPU, find_oha(), "--no-tui", "--output-format", "json",
        "-z", f"{duration}s", "-m", "POST", "-T", "application/json", "-D", str(body),
        "--cacert", str(d / "ca.pem"), "--cert", str(d / "leader-v1.pem"),
        "--key", str(d / "leader-v1.key"),
    ]
    if mode == "http2":
        argv += ["--http2", "-c", str(max(1, conns // 8)), "-p", "8"]
    elif mode in ("handshake", "resume"):
        argv += ["--disable-keepalive", "-c", str(conns)]
    elif mode == "sse":
        argv += ["-c", "1"]
    else:
        argv += ["-c", str(conns)]
    if RATE:
        argv += ["-q", str(RATE)]
    path = f"{prefix}/stream" if mode == "sse" else f"{prefix}/rpc"
    argv.append(f"https://127.0.0.1:{port}{path}")
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return json.loads(out)


# User-space cycles and instructions, and the system calls and context switches that
# make up most of the kernel's share (the tracepoint needs perf_event_paranoid <= 1 or
# root; without it perf reports "<not supported>" and the columns read 0).
PERF_EVENTS = "cycles:u,instructions:u,raw_syscalls:sys_enter,context-switches"


def perf_counters(pid):
    """Starts counting the proxy's user-space cycles and instructions (perf stat), or
    returns None without perf. Counted cycles are far steadier than /proc's tick-sampled
    user/system split, which shifts with the kernel's share from run to run."""
    if shutil.which("perf") is None:
        return None
    return subprocess.Popen(
        ["perf", "stat", "-x", ",", "-e", PERF_EVENTS, "-p", str(pid)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def read_counters(perf):
    """{"cycles:u": n, "instructions:u": n} from a perf stat started by perf_counters."""
    if perf is None:
        return {}
    perf.send_signal(signal.SIGINT)
    _, err = perf.communicate(timeout=10)
    out = {}
    for line in err.splitlines():
        fields = line.split(",")
        if len(fields) > 2 and fields[0].isdigit():
            out[fields[2]] = int(fields[0])
    return out


def measure(proxy, d, mode, duration, conns):
    user0, sys0 = proxy.times()
    perf = perf_counters(proxy.p.pid)
    result = oha(d, proxy.port, mode, duration, conns, proxy.prefix)
    counters = read_counters(perf)
    user1, sys1 = proxy.times()
    cpu = user1 - user0 + sys1 - sys0
    summary = result["summary"]
    codes = result.get("statusCodeDistribution", {})
    ok = sum(v for k, v in codes.items() if k.startswith("2"))
    total = sum(codes.values())
    # Requests cut by oha's own deadline at the end of the run are not the proxy's errors.
    errors = sum(v for k, v in result.get("errorDistribution", {}).items() if "deadline" not in k)
    pct = result.get("latencyPercentiles", {})
    return {
        "ok": ok,
        "bad": total - ok + errors,
        "rps": ok / summary["total"],
        "cpu": cpu,
        "sys": (sys1 - sys0) / cpu if cpu else 0,
        "user_us": (user1 - user0) * 1e6 / ok if ok else 0,
        "kcycles": counters.get("cycles:u", 0) / 1000 / ok if ok else 0,
        "kinstr": counters.get("instructions:u", 0) / 1000 / ok if ok else 0,
        "syscalls": counters.get("raw_syscalls:sys_enter", 0) / ok if ok else 0,
        "switches": counters.get("context-switches", 0) / ok if ok else 0,
        "p50": (pct.get("p50") or 0) * 1000,
        "p99": (pct.get("p99") or 0) * 1000,
    }


def syscall_breakdown(proxy, d, mode, duration, conns):
    """One more run under `strace -c -f`: which system calls each request costs (strace
    slows the proxy several times over, so this run's speed is not reported)."""
    out = d / f"strace-{proxy.name}.txt"
    tracer = subprocess.Popen(
        ["strace", "-c", "-f", "-q", "-o", str(out), "-p", str(proxy.p.pid)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(0.5)  # strace attaches to every thread before the load starts
    ok = measure(proxy, d, mode, duration, conns)["ok"]
    tracer.send_signal(signal.SIGINT)
    tracer.wait(10)
    calls = []
    for line in out.read_text().splitlines():
        f = line.split()
        if len(f) >= 5 and f[0][0].isdigit() and f[-1] != "total":
            errors = int(f[4]) if len(f) == 6 else 0
            calls.append((f[-1], int(f[3]), errors))
    calls.sort(key=lambda c: -c[1])
    return ok, calls


def run_mode(mode, proxies, d, backend, args):
    resumption = mode != "handshake"
    rows = {name: [] for name, _, _ in proxies}
    started = {}
    try:
        for name, binary, extra in proxies:
            started[name] = start_proxy(name, binary, d, backend, resumption, extra)
        for name, _, _ in proxies:  # warm up: pools, TLS caches, page faults
            measure(started[name], d, mode, 2, args.connections)
        for r in range(args.rounds):
            order = proxies[r % len(proxies):] + proxies[: r % len(proxies)]
            for name, _, _ in order:
                rows[name].append(measure(started[name], d, mode, args.duration, args.connections))
        if args.strace:
            for name, _, _ in proxies:
                ok, calls = syscall_breakdown(started[name], d, mode, args.duration, args.connections)
                unit = "event" if mode == "sse" else "request"
                scale = ok * (args.events if mode == "sse" else 1)
                parts = ", ".join(
                    f"{c} {n / scale:.2f}" + (f" ({e / scale:.2f} failed)" if e else "")
                    for c, n, e in calls if n / scale >= 0.01
                )
                print(f"{mode} {name}: system calls per {unit}: {parts}")
    finally:
        for name, p in started.items():
            if counts := span_counts(p):
                print(f"{mode} {name}: {counts}")
            p.stop()
    return rows


def run_idle(proxies, d, backend, args):
    """--idle: each proxy started alone per round, N connections held, its RSS per held
    connection."""
    import idle

    results = {name: [] for name, _, _ in proxies}
    for r in range(args.rounds):
        order = proxies[r % len(proxies):] + proxies[: r % len(proxies)]
        for name, binary, extra in order:
            p = start_proxy(name, binary, d, backend, True, extra)
            try:
                results[name].append(idle.hold(p, d, args.idle, args.idle_settle, RPC_BODY))
            finally:
                p.stop()
    idle.report(results, args.idle)


def median(rows, key):
    return statistics.median(r[key] for r in rows)


def report_paired(rows, scale):
    """Each `aipgw+...` arm (the same binary with something turned on) against `aipgw` round
    by round: the rounds rotate the order, so a round's two figures were taken minutes
    apart at most, and the median of the per-round ratios moves less with this machine's
    drift than the ratio of the two medians. The spread (lowest and highest round) is
    printed with it."""
    for base_name in ("aipgw", "aipgw+off"):
        base = rows.get(base_name)
        if not base:
            continue
        for name, rs in rows.items():
            if not name.startswith("aipgw+") or name == base_name:
                continue
            ratios = sorted(
                (r["ok"] / r["cpu"]) / (b["ok"] / b["cpu"])
                for r, b in zip(rs, base) if r["cpu"] and b["cpu"] and b["ok"]
            )
            if ratios:
                print(f"\n{name} / {base_name} per CPU-second, round by round: median "
                      f"{statistics.median(ratios):.3f}x (lowest {ratios[0]:.3f}x, highest {ratios[-1]:.3f}x, "
                      f"{len(ratios)} rounds)")
    first, last = rows.get("aipgw"), rows.get("aipgw+off")
    if not (first and last):
        return
    eff = lambda r: r["ok"] / r["cpu"] if r["cpu"] else 0
    for name, rs in rows.items():
        if not name.startswith("aipgw+") or name == "aipgw+off":
            continue
        ratios = sorted(eff(r) / ((eff(a) + eff(b)) / 2) for r, a, b in zip(rs, first, last) if eff(a) + eff(b))
        if ratios:
            print(f"\n{name} / the mean of aipgw and aipgw+off (first and last in the list), round by round: median "
                  f"{statistics.median(ratios):.3f}x (lowest {ratios[0]:.3f}x, highest {ratios[-1]:.3f}x)")


def report_fleet(per_cpu, sizes):
    """Each gateway binary's requests per CPU-second at each fleet size, as a ratio to its
    own first size."""
    labels = []
    for name in per_cpu:
        label = name.rsplit("=", 1)[0]
        if label not in labels:
            labels.append(label)
    for label in labels:
        first = per_cpu.get(f"{label}={sizes[0]}")
        if not first:
            continue
        ratios = ", ".join(f"{n}: {per_cpu[f'{label}={n}'] / first:.2f}x" for n in sizes)
        print(f"\n{label}: requests per CPU-second as a ratio to {sizes[0]}: {ratios}")


def report(mode, rows, events, fleet_sizes=None):
    unit = "events" if mode == "sse" else "req"
    scale = events if mode == "sse" else 1
    print(f"\n## {mode}\n")
    print(f"| proxy | {unit}/s | proxy CPU s | {unit} per CPU-second | kernel share | user µs per {unit} | user kcycles per {unit} | user kinstr per {unit} | syscalls per {unit} | context switches per {unit} | p50 ms | p99 ms | non-2xx or errors |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    per_cpu = {}
    for name, rs in rows.items():
        eff = [r["ok"] * scale / r["cpu"] if r["cpu"] else 0 for r in rs]
        per_cpu[name] = statistics.median(eff)
        print(
            f"| {name} | {median(rs, 'rps') * scale:,.0f} | {median(rs, 'cpu'):.2f} | "
            f"{per_cpu[name]:,.0f} | {median(rs, 'sys'):.0%} | {median(rs, 'user_us') / scale:.2f} | {median(rs, 'kcycles') / scale:.2f} | {median(rs, 'kinstr') / scale:.2f} | "
            f"{median(rs, 'syscalls') / scale:.2f} | {median(rs, 'switches') / scale:.3f} | {median(rs, 'p50'):.2f} | {median(rs, 'p99'):.2f} | "
            f"{sum(r['bad'] for r in rs)} |"
        )
    if "1 worker, CPU 1" in per_cpu:
        for n in per_cpu:
            base = "haproxy 1 thread, CPU 1" if n.startswith("haproxy") else "1 worker, CPU 1"
            one = per_cpu.get(base)
            if n != base and one:
                print(f"\n{n}: {per_cpu[n] / one:.2f}x the requests per CPU-second of {base} "
                      f"(as a speed-up on two cores: {2 * per_cpu[n] / one:.2f}x)")
        return
    if fleet_sizes:
        report_fleet(per_cpu, fleet_sizes)
        return per_cpu
    gateways = [n for n in per_cpu if n not in ("nginx", "haproxy", "bare")]
    report_paired(rows, scale)
    others = [n for n in ("nginx", "haproxy", "bare") if n in per_cpu and per_cpu[n]]
    for g in gateways:
        ratios = ", ".join(f"{per_cpu[g] / per_cpu[o]:.2f}x {o}" for o in others)
        if ratios:
            print(f"\n{g} per CPU-second: {ratios}")
    return per_cpu


def report_proxy_protocol(mode, per_cpu):
    """Each binary's requests per CPU-second with the PROXY header as a ratio to without."""
    for name, v in per_cpu.items():
        if name.endswith(PP_ARM) and v:
            plain = per_cpu.get(name[: -len(PP_ARM)] + PLAIN_ARM)
            if plain:
                label = name[: -len(PP_ARM)]
                print(f"\n{mode} {label}: PROXY v2 required / plain L4, requests per gateway "
                      f"CPU-second: {v / plain:.3f}x (CPU per request {plain / v:.3f}x)")


PLAIN_ARM = " via L4"
PP_ARM = " via L4 + PROXY v2"


def start_revocation(d, proxies):
    """A CRL server and an OCSP responder for the dev CA; adds `aipgw+revocation`."""
    serial = subprocess.run(["openssl", "x509", "-noout", "-serial", "-in", str(d / "leader-v1.pem")],
                            capture_output=True, text=True, check=True).stdout.strip().split("=", 1)[1]
    (d / "index.txt").write_text(f"V\t351231235959Z\t\t{serial}\tunknown\t/CN=leader\n")
    crl_port, ocsp_port = free_port(), free_port()
    crl = Proc("crl-server", [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(crl_port),
                              "--directory", str(d)], LOAD_CPU, d, wait_port=crl_port)
    # openssl ocsp is never probed with a bare connect (it would stay on that one): its
    # first line says it listens.
    ocsp = subprocess.Popen(["taskset", "-c", LOAD_CPU, "openssl", "ocsp", "-index", str(d / "index.txt"),
                             "-port", str(ocsp_port), "-rsigner", str(d / "ca.pem"), "-rkey", str(d / "ca.key"),
                             "-CA", str(d / "ca.pem"), "-nmin", "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    if "ACCEPT" not in ocsp.stdout.readline():
        die("openssl ocsp did not start")
    ocsp.stop = ocsp.kill
    toml = f"""
[revocation]
crl_urls = ["http://127.0.0.1:{crl_port}/crl.pem"]
ocsp = "soft"
ocsp_url = "http://127.0.0.1:{ocsp_port}/"
"""
    if any(n == "aipgw" for n, _, _ in proxies):
        proxies.append(("aipgw+revocation", str(RELEASE / "aipgw"), toml))
    return [crl, ocsp]


OTLP_ARMS = ("live", "dead", "bigq", "drain", "audit", "off")


def start_otlp(d, proxies, arms=OTLP_ARMS):
    """--otlp: beside aipgw, the same binary exporting every request's spans (`sample_ratio`
    1.0, OTLP/gRPC) to a live receiver (examples/otlp_sink: the official trace service,
    decoding every span; on the load's core) and to a dead one (a port nothing listens on:
    every export refused); and to the live one with a queue of 2^20 requests (`aipgw+otlp-bigq`:
so that a receiver slower than the load drops nothing); and to a receiver that only drains
the bytes (`otlp_sink --drain`, queue 2^20: `aipgw+otlp-drain`), with the audit log on too
(`aipgw+otlp+audit`): the decoding receiver shares the load generator's core and takes
enough of it to lower the load. Each one's span counters (exported, failed, dropped) are
printed at the end."""
    receivers = []
    if {"live", "bigq"} & set(arms):
        receivers.append(sink := Proc("otlp_sink", [str(RELEASE / "examples" / "otlp_sink"), "127.0.0.1:0"], LOAD_CPU, d))
    if {"drain", "audit"} & set(arms):
        receivers.append(drain := Proc("otlp_drain", [str(RELEASE / "examples" / "otlp_sink"), "127.0.0.1:0", "--drain"],
                                       LOAD_CPU, d))
    for arm, label, port, queue in (("live", "aipgw+otlp", lambda: sink.port, 2048),
                                    ("dead", "aipgw+otlp-dead", free_port, 2048),
                                    ("bigq", "aipgw+otlp-bigq", lambda: sink.port, 1 << 20),
                                    ("drain", "aipgw+otlp-drain", lambda: drain.port, 1 << 20)):
        if arm not in arms:
            continue
        toml = (f'\n[tracing]\notlp_endpoint = "http://127.0.0.1:{port()}"\nsample_ratio = 1.0\n'
                f'queue_size = {queue}\n')
        proxies.append((label, str(RELEASE / "aipgw"), toml))
    if "audit" in arms:
        # Issue 34's figure: tracing at ratio 1.0 (every span exported, nothing dropped)
        # and the audit log on together, against both off (`aipgw`).
        key = d / "audit.key"
        subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(key)], check=True)
        proxies.append(("aipgw+otlp+audit", str(RELEASE / "aipgw"),
                        f'\n[tracing]\notlp_endpoint = "http://127.0.0.1:{drain.port}"\nsample_ratio = 1.0\n'
                        f'queue_size = {1 << 20}\n\n[audit]\nfile = "{d / "audit.log"}"\nkey = "{key}"\n'
                        'aic = "10001000011K9DX1GW14X1VSP2QQNG44"\n'))
    if "off" in arms:
        # The same binary with both off again, last in the list: the arms between it and
        # `aipgw` (first) are held against both. Identical gateways have measured higher
        # the later they stand in the list (up to 7% over five in one run; not by the
        # order of starting: benches/README.md, "Tracing export"): against the mean of
        # the two, an arm between them is compared without that drift.
        proxies.append(("aipgw+off", str(RELEASE / "aipgw"), ""))
    return receivers


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for m in ("http1", "http2", "handshake", "resume", "sse"):
        ap.add_argument(f"--{m}", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=int, default=10, help="seconds per run")
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--events", type=int, default=1000, help="events per stream (--sse)")
    ap.add_argument("--gateway", action="append", default=[], help="LABEL=PATH[@TOML] of another aipgw binary; TOML is appended to its config "
                    "(e.g. a [cluster] section, to compare cluster mode with local mode)")
    ap.add_argument("--only", default="aipgw,nginx,haproxy,bare", help='comma-separated; "" for none but --gateway')
    ap.add_argument("--scaling", action="store_true", help="instead of the other proxies: aipgw with one worker on one core, "
                    "two per-core workers and two shared-runtime threads on both cores, and HAProxy with one "
                    "thread and two the same way (--http1/--http2)")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--strace", action="store_true", help="after the rounds, one run per proxy under strace -c: system calls per request by name")
    ap.add_argument("--install", action="store_true")
    ap.add_argument("--revocation", action="store_true", help="beside aipgw, the same binary with a fetched CRL and OCSP (soft, "
                    "answers cached) on, served by python3 -m http.server and openssl ocsp on loopback")
    sizes = lambda v: [int(x) for x in v.split(",") if x]  # noqa: E731
    ap.add_argument("--routes", type=sizes, default=[], help="fleet mode: N Partners, the load to the last (e.g. 1,1000,10000)")
    ap.add_argument("--proxy-protocol", action="store_true", help="each gateway behind an L4 HAProxy front, "
                    "with and without send-proxy-v2 (keep-alive HTTP/1.1 and full handshakes)")
    ap.add_argument("--rate", type=int, default=0, help="requests per second (oha -q) instead of as many as the load "
                    "generator can send: every proxy serves the same load, so its CPU per request is compared at equal "
                    "batching (the CPU-second figures still hold)")
    ap.add_argument("--otlp", action="store_true", help="beside aipgw, the same binary exporting every span (OTLP/gRPC, "
                    "ratio 1.0) to a live receiver (examples/otlp_sink) and to a dead one")
    ap.add_argument("--access", type=sizes, default=[], help="fleet mode: N allow + N deny prefixes in the target's [partner.access] (e.g. 10,1000,100000)")
    ap.add_argument("--otlp-arms", default=",".join(OTLP_ARMS),
                    help="the --otlp arms to run, of " + ",".join(OTLP_ARMS) + " (default all): e.g. audit alone "
                    "for issue 34's figure with more rounds in the same time")
    ap.add_argument("--idle", type=int, default=0, help="N held idle keep-alive mTLS connections per proxy: "
                    "RSS per held connection (after one request each)")
    ap.add_argument("--instructions", type=int, default=0, help="N: user-space instructions per keep-alive request "
                    "for every proxy, counted by valgrind (callgrind) over N and 3N requests (benches/load/instructions.py); "
                    "with --http1/--http2 (default both)")
    ap.add_argument("--idle-settle", type=float, default=3.0, help="seconds the connections are held idle before the RSS is read (--idle)")
    args = ap.parse_args()
    global RATE
    RATE = args.rate
    modes = [m for m in ("http1", "http2", "handshake", "resume", "sse") if getattr(args, m)]
    fleets = [(k, getattr(args, k)) for k in ("routes", "access") if getattr(args, k)]
    if args.instructions:
        counted, modes = modes or ["http1", "http2"], []
    modes = modes or ([] if fleets or args.proxy_protocol or args.idle or args.instructions else ["http1", "http2"])
    ensure_tools(args.install)
    if not args.no_build:
        subprocess.run(
            ["cargo", "build", "--release", "--bin", "aipgw", "--example", "bare_proxy", "--example", "load_backend"]
            + (["--example", "otlp_sink"] if args.otlp else []),
            cwd=ROOT, check=True,
        )
    only = [n for n in args.only.split(",") if n]
    for n in only:
        if n not in ("aipgw", "nginx", "haproxy", "bare"):
            die(f"--only: {n!r} is not one of aipgw, nginx, haproxy, bare")
    proxies = [(n, str(RELEASE / "aipgw") if n == "aipgw" else None, "") for n in only]
    if args.scaling:
        proxies = [(n, str(RELEASE / "aipgw"), "") for n in SCALING]
        if shutil.which("haproxy"):
            proxies += [(n, None, "") for n in HAPROXY_SCALING]
    for g in args.gateway:
        label, rest = g.split("=", 1)
        binary, _, extra = rest.partition("@")
        proxies.append((label, binary, Path(extra).read_text() if extra else ""))
    with tempfile.TemporaryDirectory(prefix="aipgw-load-") as tmp:
        d = Path(tmp)
        subprocess.run([str(RELEASE / "aipgw"), "dev-certs", "--out", str(d)], check=True, capture_output=True)
        (d / "rpc.json").write_text(RPC_BODY)
        (d / "stream.json").write_text(STREAM_BODY)
        responders = start_revocation(d, proxies) if args.revocation else []
        responders += start_otlp(d, proxies, args.otlp_arms.split(",")) if args.otlp else []
        backend = Proc("backend", [str(RELEASE / "examples" / "load_backend"), "--events", str(args.events)], LOAD_CPU, d)
        where = "the gateway on the CPUs its label names" if args.scaling else f"proxies on CPU {PROXY_CPU}"
        print(f"# load comparison, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs; {where}, "
              f"oha and the backend on CPU {LOAD_CPU}; {args.rounds} rounds of {args.duration} s, medians")
        try:
            for mode in modes:
                report(mode, run_mode(mode, proxies, d, backend.port, args), args.events)
            if args.idle:
                run_idle(proxies, d, backend.port, args)
            if args.instructions:
                import instructions

                counts = instructions.count(sys.modules[__name__], proxies, d, backend.port, args.instructions, counted)
                instructions.report(counts, args.instructions)
            for kind, ns in fleets:
                gateways = [(f"{label} {kind}", b, e) for label, b, e in proxies
                            if b is not None and not isinstance(e, Fleet)]
                fleet = [(f"{label}={n}", b, Fleet(kind, n, e)) for label, b, e in gateways for n in ns]
                print(f"\n# fleet mode --{kind}: keep-alive HTTP/1.1")
                report("http1", run_mode("http1", fleet, d, backend.port, args), args.events, ns)
            if args.proxy_protocol:
                arms = [(f"{label}{arm}", b, Front(v2, e)) for label, b, e in proxies
                        if b is not None and isinstance(e, str)
                        for arm, v2 in ((PLAIN_ARM, False), (PP_ARM, True))]
                print("\n# --proxy-protocol: each gateway behind HAProxy in TCP mode on "
                      f"CPU {LOAD_CPU}, plain and with send-proxy-v2")
                for mode in ("http1", "handshake"):
                    per_cpu = report(mode, run_mode(mode, arms, d, backend.port, args), args.events)
                    report_proxy_protocol(mode, per_cpu)
        finally:
            backend.stop()
            for r in responders:
                r.stop()


if __name__ == "__main__":
    main()
