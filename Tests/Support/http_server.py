#!/usr/bin/env python3
"""A loopback HTTP server for the download tests. Prints its port, then serves until killed.

/file/NAME        the bytes of FOLDER/NAME (Content-Length)
/status/N         status N with a short body
/slow             headers at once, then one byte every 0.5 s for 10 s
/big              Content-Length: 10,000,000 and that many bytes
/big-chunked      10,000,000 bytes without Content-Length (chunked)
/loop             a redirect to itself, forever
/to-ftp           a redirect to an ftp:// URL
/trickle          headers at once, then one byte every 0.2 s, forever (no Content-Length)
/trickle-headers  a header line every 0.2 s, forever (the status line sent, the headers never end)
/endless-headers  header lines as fast as the socket takes them, forever
/short            Content-Length: 100000, then 10 bytes and the connection closed (a lie)
/long             Content-Length: 10, then 5,000,000 bytes (a lie the other way)
/to-file          a redirect to a file:// URL
/hang             accepts, reads the request, never answers; logs "closed /hang T" to FOLDER/events.log when
                  the client goes away (T: time.time())
/redirect?URL     a redirect to URL
Every request's path is appended to FOLDER/requests.log (one line each) before it is answered: the tests
count what the server saw.
Usage: http_server.py FOLDER [ADDRESS]   (ADDRESS: a loopback address to listen on, 127.0.0.1 by default)
"""
import http.server
import socketserver
import sys
import time

FOLDER = sys.argv[1]


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send_body(self, status, body, length=True):
        self.send_response(status)
        if length:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def redirect(self, location):
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        path = self.path
        with open(FOLDER + "/requests.log", "a") as f:
            f.write(path + "\n")
        try:
            if path.startswith("/file/"):
                with open(FOLDER + "/" + path[6:], "rb") as f:
                    self.send_body(200, f.read())
            elif path.startswith("/status/"):
                self.send_body(int(path[8:]), b"status page\n")
            elif path == "/slow":
                self.send_response(200)
                self.send_header("Content-Length", "20")
                self.end_headers()
                for _ in range(20):
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.5)
            elif path == "/big":
                self.send_response(200)
                self.send_header("Content-Length", "10000000")
                self.end_headers()
                for _ in range(100):
                    self.wfile.write(b"y" * 100000)
            elif path == "/big-chunked":
                self.send_response(200)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for _ in range(100):
                    self.wfile.write(b"%x\r\n" % 100000 + b"z" * 100000 + b"\r\n")
                self.wfile.write(b"0\r\n\r\n")
            elif path == "/loop":
                self.redirect("/loop")
            elif path == "/to-ftp":
                self.redirect("ftp://127.0.0.1/x")
            elif path == "/trickle":
                self.send_response(200)
                self.end_headers()
                while True:
                    self.wfile.write(b"t")
                    self.wfile.flush()
                    time.sleep(0.2)
            elif path in ("/trickle-headers", "/endless-headers"):
                self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                n = 0
                while True:
                    self.wfile.write(b"X-Junk-%d: %s\r\n" % (n, b"j" * 1000))
                    n += 1
                    if path == "/trickle-headers":
                        self.wfile.flush()
                        time.sleep(0.2)
            elif path == "/short":
                self.send_response(200)
                self.send_header("Content-Length", "100000")
                self.end_headers()
                self.wfile.write(b"0123456789")
                self.wfile.flush()
                self.close_connection = True
            elif path == "/long":
                self.send_response(200)
                self.send_header("Content-Length", "10")
                self.send_header("Connection", "close")
                self.end_headers()
                for _ in range(50):
                    self.wfile.write(b"L" * 100000)
                self.close_connection = True
            elif path.startswith("/redirect?"):
                self.redirect(path[len("/redirect?"):])
            elif path == "/to-file":
                self.redirect("file:///etc/passwd")
            elif path == "/hang":
                self.connection.settimeout(30)
                try:
                    while self.connection.recv(1):
                        pass
                except OSError:
                    pass
                with open(FOLDER + "/events.log", "a") as f:
                    f.write("closed /hang %f\n" % time.time())
            else:
                self.send_body(404, b"no such path\n")
        except (BrokenPipeError, ConnectionResetError):
            pass


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


server = Server((sys.argv[2] if len(sys.argv) > 2 else "127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
