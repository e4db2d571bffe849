#!/usr/bin/env python3
"""A loopback OTLP/HTTP trace receiver for the tests and the benchmark.

usage: otlp_receiver.py MODE OUT
  accept   decode each POST /v1/traces with the OpenTelemetry protocol's own protobuf definitions
           (the opentelemetry-proto package; `make test` installs it under .build/python) and append one JSON
           line per span to OUT; answer 200 with an empty ExportTraceServiceResponse
  discard  answer 200 without decoding; OUT gets one line per request (the benchmark's collector)
  hang     accept connections and read requests, never answer
Prints the port it listens on (127.0.0.1, chosen by the system), then serves until killed.
"""
import json
import os
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".build", "python"))

MODE, OUT = sys.argv[1], sys.argv[2]
lock = threading.Lock()
if MODE == "accept":
    # Imported before the port is printed: a first request must not wait for it (the exporter times out in 5 s).
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2


def value(any_value):
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def spans_of(body):
    request = trace_service_pb2.ExportTraceServiceRequest()
    request.ParseFromString(body)
    for resource_spans in request.resource_spans:
        resource = {a.key: value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                yield {
                    "resource": resource,
                    "traceId": span.trace_id.hex(), "spanId": span.span_id.hex(), "parentSpanId": span.parent_span_id.hex(),
                    "name": span.name, "start": str(span.start_time_unix_nano), "end": str(span.end_time_unix_nano),
                    "attributes": {a.key: value(a.value) for a in span.attributes},
                    "status": {"code": span.status.code, "message": span.status.message},
                    "links": [{"traceId": l.trace_id.hex(), "spanId": l.span_id.hex()} for l in span.links],
                    "events": [{"name": e.name, "time": str(e.time_unix_nano), "attributes": {a.key: value(a.value) for a in e.attributes}}
                               for e in span.events],
                }


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path != "/v1/traces":
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        lines = [json.dumps(s) for s in spans_of(body)] if MODE == "accept" else [str(len(body))]
        with lock, open(OUT, "a") as out:
            out.write("".join(line + "\n" for line in lines))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()


def hang():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    print(listener.getsockname()[1], flush=True)
    held = []
    while True:
        conn, _ = listener.accept()
        held.append(conn)
        threading.Thread(target=lambda c=conn: [None for _ in iter(lambda: c.recv(65536), b"")], daemon=True).start()


if MODE == "hang":
    hang()
else:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()
