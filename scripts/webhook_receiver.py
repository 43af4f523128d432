#!/usr/bin/env python3
"""A merchant's webhook receiver for idem's tests, with the signature checked
by the `standardwebhooks` package from PyPI (an implementation nobody here
wrote).

  webhook_receiver.py serve PORT LOG   answer webhooks on 127.0.0.1:PORT and
                                       append each request to LOG (JSON lines)
  webhook_receiver.py verify LOG SECRET
                                       for each request in LOG, one JSON line:
                                       its webhook-id, path, and whether SECRET
                                       verifies it

How it answers depends on the path, so one receiver plays every kind of
endpoint:
  /ok            200
  /flaky/N       500 to the first N requests of each webhook-id, then 200
  /hang          nothing for 60 s
  /drip          200, then its body one byte every half second for 60 s
  /redirect      302 to /ok
"""
import base64
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def serve(port, log_path):
    lock = threading.Lock()
    seen = {}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            self.answer(200, b"ready")

        def do_POST(self):
            length = int(self.headers.get("content-length", "0"))
            body = self.rfile.read(length)
            webhook_id = self.headers.get("webhook-id", "")
            with lock:
                seen[(self.path, webhook_id)] = seen.get((self.path, webhook_id), 0) + 1
                count = seen[(self.path, webhook_id)]
                record = {
                    "path": self.path,
                    "at": time.time(),
                    "headers": {k.lower(): v for k, v in self.headers.items()},
                    "body": base64.b64encode(body).decode(),
                }
                with open(log_path, "a") as log:
                    log.write(json.dumps(record) + "\n")
            if self.path == "/ok":
                self.answer(200, b"ok")
            elif self.path.startswith("/flaky/"):
                failures = int(self.path.rsplit("/", 1)[1])
                self.answer(500 if count <= failures else 200, b"flaky")
            elif self.path == "/hang":
                time.sleep(60)
            elif self.path == "/drip":
                self.send_response(200)
                self.send_header("content-length", "120")
                self.end_headers()
                for _ in range(120):
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.5)
            elif self.path == "/redirect":
                self.send_response(302)
                self.send_header("location", "/ok")
                self.send_header("content-length", "0")
                self.end_headers()
            else:
                self.answer(404, b"no such endpoint")

        def answer(self, status, body):
            self.send_response(status)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    server.serve_forever()


def verify(log_path, secret):
    from standardwebhooks.webhooks import Webhook

    webhook = Webhook(secret)
    with open(log_path) as log:
        for line in log:
            record = json.loads(line)
            body = base64.b64decode(record["body"])
            try:
                webhook.verify(body, record["headers"])
                valid = True
            except Exception:  # the package raises its own errors for any mismatch
                valid = False
            print(json.dumps({
                "webhook_id": record["headers"].get("webhook-id"),
                "path": record["path"],
                "valid": valid,
            }))


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(int(sys.argv[2]), sys.argv[3])
    elif sys.argv[1:2] == ["verify"]:
        verify(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
