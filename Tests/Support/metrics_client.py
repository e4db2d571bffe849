#!/usr/bin/python3
# Reads opqueued's metrics with a real parser (prometheus_client's, Debian's python3-prometheus-client)
# and prints them as JSON, or plays a hostile client against the HTTP listener.
#
#   metrics_client.py parse            text exposition on stdin  -> {"samples": [...], "types": {...}}
#   metrics_client.py scrape URL       GET URL, same output, plus "contentType"
#   metrics_client.py abuse HOST PORT  connects and hangs up, sends garbage, oversized headers, half a
#                                      request, and holds many idle connections; prints what came back
import json
import socket
import sys
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def parsed(text):
    samples, types = [], {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            samples.append({"name": s.name, "labels": s.labels, "value": s.value})
    return {"samples": samples, "types": types}


def abuse(host, port):
    seen = {}
    # Connect and hang up at once, ten times.
    for _ in range(10):
        socket.create_connection((host, port)).close()
    # Garbage: NIO's decoder answers 400 (or closes).
    s = socket.create_connection((host, port))
    s.settimeout(5)
    s.sendall(b"\x00\x01\x02 NOT HTTP AT ALL\r\n\r\n")
    seen["garbage"] = s.recv(100).decode("latin-1").split("\r\n")[0]
    s.close()
    # Headers that never end, far past the limit: the server closes.
    s = socket.create_connection((host, port))
    s.settimeout(5)
    try:
        s.sendall(b"GET /metrics HTTP/1.1\r\n")
        for _ in range(100):
            s.sendall(b"X-Filler: " + b"a" * 1000 + b"\r\n")
        seen["oversized"] = repr(s.recv(100))
    except OSError as e:
        seen["oversized"] = "closed: " + type(e).__name__
    s.close()
    # A request sent and the answer never read: the server's write must not hurt it.
    s = socket.create_connection((host, port))
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    s.close()
    # Half a request, then silence: the server drops it by itself.
    s = socket.create_connection((host, port))
    s.settimeout(30)
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    start = time.time()
    try:
        data = s.recv(100)
        seen["stalled"] = {"closedAfter": round(time.time() - start, 1), "data": repr(data)}
    except socket.timeout:
        seen["stalled"] = {"closedAfter": None}
    s.close()
    # More idle connections than the server serves at once.
    idle = [socket.create_connection((host, port)) for _ in range(80)]
    seen["idleOpened"] = len(idle)
    for c in idle:
        c.close()
    print(json.dumps(seen))


def main():
    if sys.argv[1] == "parse":
        print(json.dumps(parsed(sys.stdin.read())))
    elif sys.argv[1] == "scrape":
        with urllib.request.urlopen(sys.argv[2], timeout=10) as r:
            out = parsed(r.read().decode("utf-8"))
            out["contentType"] = r.headers.get("Content-Type")
            print(json.dumps(out))
    elif sys.argv[1] == "abuse":
        abuse(sys.argv[2], int(sys.argv[3]))


main()
