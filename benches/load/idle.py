"""--idle N for run.py: memory per held idle keep-alive mTLS connection.

For each proxy in turn (started alone, as for the other modes): one request on a
throwaway connection (first-use growth out of the way), the proxy's RSS read, then N
mutual-TLS 1.3 HTTP/1.1 connections opened, one `rpc` answered on each, all of them
held open and idle; after `settle` seconds (past the gateway's
`listener.idle_release_after`) the RSS is read again, and the connections still open
are counted (a proxy that closed some would look cheaper). RSS is /proc/PID/status
VmRSS: what the held connections cost in memory pages, whatever the allocator. For a
gateway, its allocator's live bytes (`aipgw_allocator_bytes{kind="allocated"}` from its
admin /metrics, jemalloc builds) are read at the same two moments: the heap the held
connections keep, beside the pages it takes.
"""

import resource
import select
import socket
import ssl
import statistics
import time


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def allocated(proxy):
    """The gateway's live heap bytes (jemalloc's `allocated`), or None for another proxy."""
    config = getattr(proxy, "config", None)
    if config is None:
        return None
    import urllib.request
    binds = [l for l in config.read_text().splitlines() if l.startswith("bind = ")]
    addr = binds[-1].split('"')[1]
    text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith('aipgw_allocator_bytes{kind="allocated"}'):
            return int(float(line.split()[-1]))
    return None


def _client(d):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_verify_locations(str(d / "ca.pem"))
    ctx.load_cert_chain(str(d / "leader-v1.pem"), str(d / "leader-v1.key"))
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def _request(prefix, body):
    head = (
        f"POST {prefix}/rpc HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body.encode()


def _read_response(s):
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            raise RuntimeError("closed before the answer's head")
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(rest) < length:
        chunk = s.recv(65536)
        if not chunk:
            raise RuntimeError("closed mid-answer")
        rest += chunk
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(head.decode(errors="replace"))


def _open(ctx, port, req):
    raw = socket.create_connection(("127.0.0.1", port))
    s = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
    s.sendall(req)
    _read_response(s)
    return s


def _still_open(s):
    """False if the proxy closed it (readable with nothing, or an error)."""
    try:
        readable, _, _ = select.select([s], [], [], 0)
        if not readable:
            return True
        s.setblocking(False)
        try:
            data = s.recv(1)
        except ssl.SSLWantReadError:
            return True  # a TLS record without application data (a session ticket)
        return bool(data)
    except OSError:
        return False


def hold(proxy, d, n, settle, body):
    """(RSS before, RSS after, connections still open, heap before, heap after) for `n`
    held connections (the heap figures None for a proxy that has none to show)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n + 64:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 1024), hard))
    ctx = _client(d)
    req = _request(proxy.prefix, body)
    _open(ctx, proxy.port, req).close()
    time.sleep(settle)
    before = rss_kib(proxy.p.pid)
    heap_before = allocated(proxy)
    conns = [_open(ctx, proxy.port, req) for _ in range(n)]
    time.sleep(settle)
    after = rss_kib(proxy.p.pid)
    heap_after = allocated(proxy)
    alive = sum(1 for s in conns if _still_open(s))
    for s in conns:
        s.close()
    return before, after, alive, heap_before, heap_after


def report(results, n):
    print(f"\n## held idle keep-alive connections (--idle {n}): RSS per held connection")
    print("| proxy | rounds | RSS before (MiB) | RSS after (MiB) | still open | **KiB per connection** | live heap KiB per connection |")
    print("|---|---|---|---|---|---|---|")
    per = {}
    for name, rows in results.items():
        kib = statistics.median((a - b) / n for b, a, *_ in rows)
        per[name] = kib
        before = statistics.median(b for b, *_ in rows) / 1024
        after = statistics.median(r[1] for r in rows) / 1024
        alive = min(r[2] for r in rows)
        heaps = [(r[4] - r[3]) / 1024 / n for r in rows if r[3] is not None and r[4] is not None]
        heap = f"{statistics.median(heaps):.1f}" if heaps else ""
        print(f"| {name} | {len(rows)} | {before:.1f} | {after:.1f} | {alive}/{n} | **{kib:.1f}** | {heap} |")
    if "aipgw" in per:
        for name, kib in per.items():
            if name != "aipgw" and kib > 0:
                print(f"aipgw / {name}: {per['aipgw'] / kib:.2f}x the memory per held connection")
