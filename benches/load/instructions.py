"""--instructions N for run.py: user-space instructions per request, counted, not timed.

On a shared two-core machine the time per request moves by several percent between runs
of one binary (benches/README.md, "Paired rounds, and the list-position drift"), more
than a trim of the request path saves. Instructions do not: valgrind (callgrind) counts
every user-space instruction a proxy executes, whatever else the machine does.

For each proxy, twice: started under callgrind alone, `N` then `3N` keep-alive requests
sent by oha one at a time on one connection (so that no run batches requests
differently), the proxy stopped and its counts read by thread. The difference between
the two runs, in the thread whose count grew the most (the one that served the
connection: the gateway's worker, NGINX's worker process, HAProxy's thread), divided by
`2N` is what one request costs: start-up, handshakes and shut-down, the same in both
runs, cancel out. Kernel time is not counted (valgrind sees user space
only); crypto runs its AVX2 paths under valgrind (no AVX-512 there), for every proxy
alike. With `CALLGRIND_KEEP=DIR` the runs' callgrind files are kept there, to be read
with `callgrind_annotate` (where the instructions go, function by function).
"""

import os
import shutil
import subprocess
import time
from pathlib import Path

# How long a proxy under valgrind may take to start, and to write its counts on exit.
START_WAIT = 120
STOP_WAIT = 120


def _callgrind_argv(out):
    return [
        "valgrind", "--tool=callgrind", "--trace-children=yes", "--separate-threads=yes",
        f"--callgrind-out-file={out}.%p", "--dump-line=no", "--compress-strings=no",
    ]


def _threads(out):
    """A run's instructions by thread (callgrind writes a file per thread of each process,
    `<out>.<pid>-<thread>`), summed over the processes by thread number."""
    counts = {}
    for f in out.parent.glob(out.name + ".*"):
        thread = f.name.rsplit("-", 1)[-1]
        for line in f.read_text(errors="replace").splitlines():
            if line.startswith("totals:") or line.startswith("summary:"):
                counts[thread] = counts.get(thread, 0) + int(line.split()[1])
                break
    return counts


def _oha(run, d, port, mode, n, conns, prefix):
    argv = [
        "taskset", "-c", run.LOAD_CPU, run.find_oha(), "--no-tui", "--output-format", "json",
        "-n", str(n), "-m", "POST", "-T", "application/json", "-D", str(d / "rpc.json"),
        "--cacert", str(d / "ca.pem"), "--cert", str(d / "leader-v1.pem"),
        "--key", str(d / "leader-v1.key"), "-t", "60s",
    ]
    if mode == "http2":
        argv += ["--http2", "-c", "1", "-p", str(conns)]
    else:
        argv += ["-c", str(conns)]
    argv.append(f"https://127.0.0.1:{port}{prefix}/rpc")
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    import json

    summary = json.loads(out)
    ok = summary.get("statusCodeDistribution", {}).get("200", 0)
    if ok != n:
        raise RuntimeError(f"{ok} of {n} requests answered 200: {summary.get('errorDistribution')}")


def _one(run, name, binary, extra, d, backend, mode, n, conns, tag):
    out = d / f"cg-{name}-{mode}-{tag}"
    for old in d.glob(out.name + ".*"):
        old.unlink()
    run.WRAP = _callgrind_argv(out)
    try:
        p = run.start_proxy(name, binary, d, backend, True, extra, start_wait=START_WAIT)
    finally:
        run.WRAP = []
    try:
        _oha(run, d, p.port, mode, n, conns, p.prefix)
    finally:
        p.stop(wait=STOP_WAIT)
    # NGINX's workers exit after the master returns; give their files a moment.
    for _ in range(50):
        if _threads(out):
            break
        time.sleep(0.2)
    keep = os.environ.get("CALLGRIND_KEEP")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        for f in out.parent.glob(out.name + ".*"):
            shutil.copy(f, Path(keep) / f.name)
    return _threads(out)


def count(run, proxies, d, backend, n, modes, conns=1):
    """Instructions per request for each proxy and mode: {mode: {name: per_request}}."""
    results = {}
    for mode in modes:
        results[mode] = {}
        for name, binary, extra in proxies:
            low = _one(run, name, binary, extra, d, backend, mode, n, conns, "low")
            high = _one(run, name, binary, extra, d, backend, mode, 3 * n, conns, "high")
            # The thread that served the requests is the one whose count grew with them.
            # The others' work is periodic (upkeep, metrics, the allocator's): it grows
            # with how long a run takes under valgrind, not with its requests, and
            # counting it made two runs of one binary differ by 4%.
            grew = max(high[t] - low.get(t, 0) for t in high)
            results[mode][name] = grew / (2 * n)
    return results


def report(results, n):
    print(f"\n## user-space instructions per request (callgrind, {n} and {3 * n} requests, the difference)")
    for mode, per in results.items():
        print(f"\n### {mode}\n")
        print("| proxy | instructions per request | / first |")
        print("|---|---|---|")
        first = next(iter(per.values()), 0) or 1
        for name, v in per.items():
            print(f"| {name} | {v:,.0f} | {v / first:.2f}x |")
