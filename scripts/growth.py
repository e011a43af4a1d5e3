#!/usr/bin/env python3
"""How sluice's cost grows with its work (docs/performance.md#how-the-cost-grows-with-the-work).

Run through scripts/growth.sh, which installs what this needs and builds the release binaries.
For each dimension, one gateway per size on loopback (the release build, 1 thread, Redis and
the demo upstream beside it), measuring: CPU per request (the gateway's user + system time over
the requests wrk completed) and wrk's p99 over a short closed-loop run, the time a reload of
the same configuration takes (SIGHUP until sluice_config_reloads_total{result="success"} moves),
the gateway's RSS, and Redis's used_memory. Then the exponent of each curve: the slope of
log(cost) against log(size) between the smallest and the largest size.

Dimensions (sizes: GROWTH_SCALE=small divides the largest by 10):
  routes      10 .. 10,000 routes, each its own path prefix and limit; requests to the last one
  limits      1 .. 8 limits on the route (exact GCRA, every one passes)
  clients     10k .. 1M distinct clients (X-Forwarded-For from a trusted proxy), two requests
              each under a limit of 1 per 2 s keyed per client (the second refused, so the deny
              cache fills); then memory again after the limits' keys and denials have expired
  api_keys    1k .. 1M API keys in the key file; requests with one of them
  overrides   0 .. 1,000 quota overrides (the admin API), requests by a consumer with one
"""

import hashlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLUICE = os.path.join(ROOT, "target/release/sluice")
UPSTREAM = os.path.join(ROOT, "target/release/demo-upstream")
HZ = os.sysconf("SC_CLK_TCK")
SECONDS = int(os.environ.get("GROWTH_SECONDS", "3"))
SMALL = os.environ.get("GROWTH_SCALE") == "small"
TOKEN = "growth-bench-admin-token"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, seconds=120, proc=None):
    end = time.time() + seconds
    while time.time() < end:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"the process for port {port} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"port {port} never opened")


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class Bench:
    """Redis and the demo upstream for the whole run; one gateway at a time."""

    def __init__(self, work):
        self.work = work
        self.procs = []
        self.redis_port = free_port()
        self.upstream_port = free_port()
        self.spawn(["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1",
                    "--save", "", "--appendonly", "no"])
        self.spawn([UPSTREAM, f"127.0.0.1:{self.upstream_port}"])
        wait_port(self.redis_port)
        wait_port(self.upstream_port)

    def spawn(self, argv, **kw):
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)
        self.procs.append(p)
        return p

    def redis(self, *args):
        out = subprocess.run(["redis-cli", "-p", str(self.redis_port), *args],
                             capture_output=True, text=True, check=True).stdout
        return out

    def redis_memory_mib(self):
        info = self.redis("info", "memory")
        return int(re.search(r"used_memory:(\d+)", info).group(1)) / 2**20

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


class Gateway:
    """One sluice with the configuration `body` (routes and the rest) under the bench's Redis."""

    def __init__(self, bench, name, body):
        self.bench = bench
        self.port = free_port()
        self.admin = free_port()
        self.path = os.path.join(bench.work, f"{name}.yaml")
        head = (
            f"server: {{ threads: 1, pid_file: {bench.work}/{name}.pid, "
            f"upgrade_sock: {bench.work}/{name}.sock, grace_period_seconds: 0, "
            "graceful_shutdown_timeout_seconds: 0 }\n"
            f"listen: [127.0.0.1:{self.port}]\n"
            f"admin: {{ listen: 127.0.0.1:{self.admin}, token: {TOKEN} }}\n"
            f"redis: {{ url: \"redis://127.0.0.1:{bench.redis_port}/0\", timeout_ms: 100 }}\n"
            "trusted_proxies: [127.0.0.1/32]\n"
        )
        with open(self.path, "w") as f:
            f.write(head + body)
        started = time.time()
        self.proc = subprocess.Popen([SLUICE, "-c", self.path], stdout=subprocess.DEVNULL,
                                     stderr=open(os.path.join(bench.work, f"{name}.log"), "w"),
                                     env={**os.environ, "RUST_LOG": "warn"})
        wait_port(self.port, 600, self.proc)
        self.start_s = time.time() - started

    def reloads(self):
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.admin}/metrics", timeout=5).read()
        m = re.search(rb'sluice_config_reloads_total\{result="success"\} (\d+)', text)
        return int(m.group(1)) if m else 0

    def reload_s(self):
        """Seconds from SIGHUP until the reload of the same file is counted a success."""
        before = self.reloads()
        started = time.time()
        self.proc.send_signal(signal.SIGHUP)
        while self.reloads() == before:
            if time.time() - started > 600:
                raise SystemExit("reload never finished")
            time.sleep(0.005)
        return time.time() - started

    def admin_put(self, path):
        request = urllib.request.Request(f"http://127.0.0.1:{self.admin}{path}", method="PUT",
                                         headers={"Authorization": f"Bearer {TOKEN}"})
        urllib.request.urlopen(request, timeout=5).read()

    def load(self, path, lua=None, connections=16, seconds=SECONDS):
        """A closed-loop wrk run: (µs of gateway CPU per request, p99 ms, requests, non-2xx)."""
        argv = ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency"]
        if lua:
            script = os.path.join(self.bench.work, "load.lua")
            with open(script, "w") as f:
                f.write(lua)
            argv += ["-s", script]
        before = cpu_ticks(self.proc.pid)
        out = subprocess.run(argv + [f"http://127.0.0.1:{self.port}{path}"],
                             capture_output=True, text=True).stdout
        ticks = cpu_ticks(self.proc.pid) - before
        requests = int(re.search(r"(\d+) requests in", out).group(1))
        p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)\b", out)
        scale = {"us": 1e-3, "ms": 1.0, "s": 1e3}[p99.group(2)]
        bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
        return (ticks * 1e6 / HZ / max(requests, 1), float(p99.group(1)) * scale, requests,
                int(bad.group(1)) if bad else 0)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


def route(name, prefix, upstream, limits, extra=""):
    text = (f"  - name: {name}\n    match: {{ path_prefix: {prefix} }}\n"
            f"    upstream: {{ servers: [127.0.0.1:{upstream}] }}\n{extra}")
    if limits:
        text += "    limits:\n" + "".join(f"      - {limit}\n" for limit in limits)
    return text


def gcra(name, key, mode="exact"):
    return (f"{{ name: {name}, key: [{key}], algorithm: gcra, rate: 1000000/s, "
            f"burst: 1000000, mode: {mode} }}")


def sizes(*values):
    return values[:-1] + (values[-1] // 10,) if SMALL else values


def measure(bench, gateway, path, lua=None):
    cpu, p99, requests, bad = gateway.load(path, lua)
    return {"cpu_us": cpu, "p99_ms": p99, "requests": requests, "non2xx": bad,
            "reload_s": gateway.reload_s(), "rss_mib": rss_mib(gateway.proc.pid),
            "redis_mib": bench.redis_memory_mib(), "start_s": gateway.start_s}


def routes(bench):
    for n in sizes(10, 100, 1000, 10000):
        body = "routes:\n" + "".join(
            route(f"r{i}", f"/r{i}/", bench.upstream_port, [gcra("per_client", "client_ip")])
            for i in range(n))
        g = Gateway(bench, f"routes{n}", body)
        yield n, measure(bench, g, f"/r{n - 1}/x")
        g.stop()


def limits(bench):
    keys = ["client_ip", "path", "route", "method", "client_ip, path", "client_ip, route",
            "path, method", "client_ip, method"]
    for n in (1, 2, 4, 8):
        body = "routes:\n" + route("api", "/", bench.upstream_port,
                                   [gcra(f"l{i}", keys[i]) for i in range(n)])
        g = Gateway(bench, f"limits{n}", body)
        yield n, measure(bench, g, "/x")
        g.stop()


DISTINCT_CLIENTS_LUA = """
local n, stop_at = 0, %d
request = function()
  n = n + 1
  local client = math.floor((n + 1) / 2)
  local a = client %% 256; local b = math.floor(client / 256) %% 256
  local c = math.floor(client / 65536) %% 256
  return wrk.format(nil, nil, { ["X-Forwarded-For"] = "10." .. c .. "." .. b .. "." .. a })
end
response = function() if n >= stop_at then wrk.thread:stop() end end
"""


def clients(bench):
    for n in sizes(10_000, 100_000, 1_000_000):
        bench.redis("flushall")
        # Each client sends two requests: the first passes, the second is refused and leaves an
        # entry in the deny cache until the window ends.
        limit = "{ name: per_client, key: [client_ip], algorithm: fixed_window, rate: 1/2s }"
        g = Gateway(bench, f"clients{n}", "routes:\n" + route("api", "/", bench.upstream_port,
                                                                [limit]))
        idle = rss_mib(g.proc.pid)
        # wrk waits out its duration even once the script has stopped it: the duration is sized
        # to the requests (about 7,000 a second on one connection here); clients reached is
        # half the requests it completed.
        cpu, p99, requests, bad = g.load("/x", DISTINCT_CLIENTS_LUA % (2 * n), connections=1,
                                         seconds=max(SECONDS, n // 3000 + 5))
        row = {"cpu_us": cpu, "p99_ms": p99, "requests": requests, "non2xx": bad,
               "reload_s": g.reload_s(), "rss_mib": rss_mib(g.proc.pid),
               "redis_mib": bench.redis_memory_mib(), "start_s": g.start_s, "idle_rss_mib": idle,
               "clients_reached": requests // 2}
        time.sleep(12)  # the windows' keys expire (2 s windows) and idle entries go
        g.load("/x", None, connections=1, seconds=1)
        row["rss_after_mib"] = rss_mib(g.proc.pid)
        row["redis_after_mib"] = bench.redis_memory_mib()
        yield n, row
        g.stop()


def api_keys(bench):
    for n in sizes(1000, 10_000, 100_000, 1_000_000):
        key_file = os.path.join(bench.work, f"api-keys-{n}.yaml")
        with open(key_file, "w") as f:
            f.write("keys:\n")
            for i in range(n):
                digest = hashlib.sha256(f"growth-key-{i}".encode()).hexdigest()
                f.write(f"  - {{ hash: \"sha256:{digest}\", consumer: c{i} }}\n")
        body = (f"identity:\n  api_keys: {{ file: {key_file} }}\n"
                "routes:\n" + route("api", "/", bench.upstream_port,
                                    [gcra("per_consumer", "consumer")], "    auth: required\n"))
        g = Gateway(bench, f"keys{n}", body)
        lua = f'wrk.headers["x-api-key"] = "growth-key-{n - 1}"\n'
        yield n, measure(bench, g, "/x", lua)
        g.stop()


def overrides(bench):
    key_file = os.path.join(bench.work, "override-keys.yaml")
    with open(key_file, "w") as f:
        f.write("keys:\n")
        for i in range(1000):
            digest = hashlib.sha256(f"growth-key-{i}".encode()).hexdigest()
            f.write(f"  - {{ hash: \"sha256:{digest}\", consumer: c{i} }}\n")
    body = (f"identity:\n  api_keys: {{ file: {key_file} }}\n"
            "routes:\n" + route("api", "/", bench.upstream_port,
                                [gcra("per_consumer", "consumer")], "    auth: required\n"))
    for n in (0, 10, 100, 1000):
        bench.redis("flushall")
        g = Gateway(bench, f"overrides{n}", body)
        for i in range(n):
            g.admin_put(f"/v1/quota/overrides?route=api&limit=per_consumer&consumer=c{i}"
                        "&quota=2000000&ttl_seconds=3600")
        lua = 'wrk.headers["x-api-key"] = "growth-key-0"\n'
        yield n, measure(bench, g, "/x", lua)
        g.stop()


DIMENSIONS = {"routes": routes, "limits": limits, "clients": clients, "api_keys": api_keys,
              "overrides": overrides}
COLUMNS = [("cpu_us", "CPU µs/req"), ("p99_ms", "p99 ms"), ("reload_s", "reload s"),
           ("rss_mib", "gateway RSS MiB"), ("redis_mib", "Redis MiB")]


def exponent(rows, column):
    # A size of 0 (no overrides) is read as 1: the curve from none to the first.
    (x0, a), (x1, b) = (max(rows[0][0], 1), rows[0][1][column]), (rows[-1][0], rows[-1][1][column])
    if a <= 0 or b <= 0 or x0 == x1:
        return float("nan")
    return math.log(b / a) / math.log(x1 / x0)


def main():
    chosen = sys.argv[1:] or list(DIMENSIONS)
    with tempfile.TemporaryDirectory() as work:
        bench = Bench(work)
        try:
            results = {}
            for dimension in chosen:
                print(f"# {dimension}", file=sys.stderr, flush=True)
                results[dimension] = list(DIMENSIONS[dimension](bench))
        finally:
            bench.stop()
    print(f"command: scripts/growth.sh {' '.join(sys.argv[1:])}".rstrip())
    for dimension, rows in results.items():
        print(f"\n{dimension}\n")
        print("| size | " + " | ".join(label for _, label in COLUMNS) + " | non-2xx |"
              + (" RSS / Redis MiB after expiry |" if "rss_after_mib" in rows[0][1] else ""))
        print("| --- " * (len(COLUMNS) + 2 + ("rss_after_mib" in rows[0][1])) + "|")
        for size, row in rows:
            cells = [f"{row[c]:.2f}" if c != "reload_s" else f"{row[c]:.3f}" for c, _ in COLUMNS]
            after = (f" {row['rss_after_mib']:.1f} / {row['redis_after_mib']:.1f} |"
                     if "rss_after_mib" in row else "")
            print(f"| {size:,} | " + " | ".join(cells) + f" | {row['non2xx']} |" + after)
        print("| exponent | " + " | ".join(f"{exponent(rows, c):.2f}" for c, _ in COLUMNS)
              + " | |" + (" |" if "rss_after_mib" in rows[0][1] else ""))
        print(json.dumps({"dimension": dimension, "rows": rows}), file=sys.stderr)


if __name__ == "__main__":
    main()
