"""An IACP 1.1 forager, written from the ANTFARM article alone (plain sockets and json;
nothing from porter_mesh), for the bridge's tests.

It connects to the queen, sends ``hb`` every ``--hb`` seconds with its heartbeat record
(``slots``, ``tools``), and answers each ``task.assign`` as ``--mode`` says:

* ``work``: ``task.accept``, then the final ``task.result`` (status ok, one artifact);
* ``reject``: ``task.reject`` with ``body.reason``;
* ``partial``: accept, two partial results (``body.partial: true``), then the final one;
* ``hold``: accept, then wait: each ``go`` line on stdin sends the oldest held result;
* ``silent``: answer nothing;
* ``no-accept``: the final result without accepting first.

``--reconnect SECONDS`` makes it connect again when the queen goes away (EOF or a reset),
trying for that long, keeping the tasks it holds; it stops for good only on ``ctl.halt``,
as IACP requires. An assign whose ``id`` it already received is the same assign (ids are
unique per sender): it is reported (``repeat``) and not worked again.
``--die-after-accept`` makes it SIGKILL itself right after accepting;
``--ignore-cancel`` keeps a held task after ``task.cancel`` (IACP: "best effort"). ``--version``
sends another protocol version. Each line read on stdin is a JSON command (``op``):
``go``, ``raw`` (send ``text`` as one line, as is, ``n`` times), ``send`` (a message of
``kind`` with ``ref`` and ``body``), ``hb-stop``, ``hb-start``, ``quit``. Every line it
prints is a JSON event (``ev``): ``up`` (connected), ``recv`` (a message from the queen,
whole), ``sent`` (kind, id, ref), ``repeat`` (an assign id seen before), ``reconnected``,
``closed`` (why).
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import signal
import socket
import sys
import time


def emit(**fields: object) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


class Forager:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.name = args.name
        self.sock = self.connect()
        self.assigned: set[str] = set()
        self.counter = 0x4f91c0
        self.buf = b""
        self.commands = b""
        self.held: list[dict] = []
        self.beating = True
        self.next_hb = 0.0

    def connect(self) -> socket.socket:
        sock = socket.create_connection((self.args.host, self.args.port), timeout=10)
        sock.setblocking(False)
        return sock

    def reconnect(self) -> bool:
        """Connect again for up to ``--reconnect`` seconds; True when connected."""
        self.sock.close()
        deadline = time.monotonic() + self.args.reconnect
        while time.monotonic() < deadline:
            try:
                self.sock = self.connect()
            except OSError:
                time.sleep(0.1)  # the queen is not listening yet: try again shortly
                continue
            self.buf = b""
            self.next_hb = 0.0
            emit(ev="reconnected")
            return True
        return False

    def send(self, kind: str, ref: str | None = None, body: dict | None = None) -> str:
        self.counter += 1
        msg = {"v": self.args.version, "id": f"m-{self.counter:06x}", "from": self.name,
               "to": "queen", "kind": kind, "ts": int(time.time())}
        if ref is not None:
            msg["ref"] = ref
        if body is not None:
            msg["body"] = body
        self.write((json.dumps(msg) + "\n").encode())
        emit(ev="sent", kind=kind, id=msg["id"], ref=ref)
        return msg["id"]

    def write(self, data: bytes) -> None:
        self.sock.setblocking(True)
        try:
            self.sock.sendall(data)
        except OSError as exc:
            # The queen went away; reading says so next (and reconnects if told to).
            emit(ev="write-failed", why=str(exc))
        finally:
            self.sock.setblocking(False)

    def heartbeat(self) -> None:
        self.send("hb", body={"slots": self.args.slots, "tools": self.args.tools,
                              "status": "busy" if self.held else "idle"})

    def result(self, assign: dict, *, partial: bool = False, n: int = 0) -> None:
        node = assign["body"].get("node", "?")
        rev = assign["body"].get("revision", 0)
        body: dict = {"status": "ok", "artifacts": [f"cm://{self.name}/{node}/r{rev}"],
                      "summary": f"{self.name} did {assign['body'].get('summary', node)}"}
        if partial:
            body = {"partial": True, "summary": f"step {n} of {node}",
                    "artifacts": [f"cm://{self.name}/{node}/part{n}"]}
        self.send("task.result", ref=assign["id"], body=body)

    def on_assign(self, msg: dict) -> None:
        mode = self.args.mode
        if mode == "silent":
            return
        if mode == "reject":
            self.send("task.reject", ref=msg["id"], body={"reason": self.args.reason})
            return
        if mode != "no-accept":
            self.send("task.accept", ref=msg["id"])
            if self.args.die_after_accept:
                emit(ev="dying")
                os.kill(os.getpid(), signal.SIGKILL)
        if self.args.remember:
            self.send("mem.sync", ref=msg["id"],
                      body={"about": msg["body"].get("node", "?"), "finding": self.args.remember})
        if mode == "hold":
            self.held.append(msg)
            return
        if mode == "partial":
            self.result(msg, partial=True, n=1)
            self.result(msg, partial=True, n=2)
        self.result(msg)

    def on_line(self, line: bytes) -> bool:
        msg = json.loads(line)
        emit(ev="recv", msg=msg)
        kind = msg.get("kind")
        if kind == "task.assign":
            if msg["id"] in self.assigned:
                emit(ev="repeat", id=msg["id"])
            else:
                self.assigned.add(msg["id"])
                self.on_assign(msg)
        elif kind == "task.cancel" and not self.args.ignore_cancel:
            self.held = [m for m in self.held if m["id"] != msg.get("ref")]
        elif kind == "ctl.halt":
            return False
        return True

    def on_command(self, line: str) -> bool:
        command = json.loads(line)
        cmd = command["op"]
        if cmd == "go" and self.held:
            self.result(self.held.pop(0))
        elif cmd == "raw":
            text = command["text"].encode()
            for _ in range(command.get("n", 1)):
                self.write(text + b"\n")
            emit(ev="sent-raw", size=len(text), n=command.get("n", 1))
        elif cmd == "send":
            self.send(command["kind"], ref=command.get("ref"), body=command.get("body"))
        elif cmd == "hb-stop":
            self.beating = False
        elif cmd == "hb-start":
            self.beating = True
            self.next_hb = 0.0
        elif cmd == "quit":
            return False
        return True

    def run(self) -> int:
        emit(ev="up", name=self.name)
        sel = selectors.DefaultSelector()
        sel.register(self.sock, selectors.EVENT_READ, "sock")
        sel.register(sys.stdin, selectors.EVENT_READ, "stdin")
        while True:
            now = time.monotonic()
            if self.beating and now >= self.next_hb:
                self.heartbeat()
                self.next_hb = now + self.args.hb
            for key, _ in sel.select(timeout=max(0.01, self.next_hb - time.monotonic())):
                if key.data == "stdin":
                    chunk = os.read(sys.stdin.fileno(), 65536)
                    self.commands += chunk
                    lines = self.commands.split(b"\n")
                    self.commands = lines.pop()
                    if not chunk or not all(self.on_command(c.decode()) for c in lines
                                            if c.strip()):
                        emit(ev="closed", why="stdin")
                        return 0
                    continue
                try:
                    data = self.sock.recv(65536)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError as exc:
                    data, why = b"", str(exc)
                else:
                    why = "eof"
                if not data:
                    sel.unregister(self.sock)
                    if self.args.reconnect and self.reconnect():
                        sel.register(self.sock, selectors.EVENT_READ, "sock")
                        break
                    emit(ev="closed", why=why)
                    return 0
                self.buf += data
                while b"\n" in self.buf:
                    line, self.buf = self.buf.split(b"\n", 1)
                    if line.strip() and not self.on_line(line):
                        emit(ev="closed", why="halt")
                        return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--mesh", help="not used: IACP has no mesh (the test harness passes it)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=7421)
    parser.add_argument("--slots", type=int, default=1)
    parser.add_argument("--tools", nargs="*", default=["crawl"])
    parser.add_argument("--version", default="1.1")
    parser.add_argument("--hb", type=float, default=10.0)
    parser.add_argument("--mode", default="work",
                        choices=("work", "reject", "partial", "hold", "silent", "no-accept"))
    parser.add_argument("--reason", default="no crawler for that index")
    parser.add_argument("--remember", help="send mem.sync with this finding after accepting")
    parser.add_argument("--reconnect", type=float, default=0.0, metavar="SECONDS",
                        help="connect again when the queen goes away, for this long")
    parser.add_argument("--die-after-accept", action="store_true")
    parser.add_argument("--ignore-cancel", action="store_true",
                        help="keep working on a cancelled task (cancel is best effort)")
    return Forager(parser.parse_args()).run()


if __name__ == "__main__":
    sys.exit(main())
