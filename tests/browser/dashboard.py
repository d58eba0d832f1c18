"""Processes and pages for the browser tests: ``porter-mesh ui``, example agents, and
headless Chromium (Debian's ``/usr/bin/chromium``) driven by Playwright.

Every process is started here and ended by its pid (SIGTERM, then SIGKILL after a grace
period). Nothing waits on sleeps: a process's output is read by a thread and waited for
with a deadline, and the page is waited on with Playwright's own expectations.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ("--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run")
VIEWPORT = {"width": 1440, "height": 900}
URL_LINE = "porter-ui: open "


def missing_browser() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return ("the Python package playwright is not installed "
                "(pip install -e '.[test]')")
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is missing (apt-get install chromium)"
    return None


class Proc:
    """A ``porter-mesh`` command run as a process; its output lines collected by a thread."""

    running: set[int] = set()  # pids of the Procs not yet stopped

    def __init__(self, name: str, args: Sequence[str], *, log_dir: Path) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        log_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "porter_mesh.cli.main", *args], stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
            start_new_session=True)
        Proc.running.add(self.proc.pid)
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, name=f"read-{name}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with open(self.log_path, "w") as log:
            for line in self.proc.stdout:
                log.write(line)
                log.flush()
                with self._changed:
                    self.lines.append(line.rstrip("\n"))
                    self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_line(self, pred: Callable[[str], bool], timeout: float, what: str) -> str:
        """The first output line matching ``pred``, waiting up to ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        seen = 0
        with self._changed:
            while True:
                for line in self.lines[seen:]:
                    if pred(line):
                        return line
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(f"{self.name}: no {what} within {timeout}s "
                                         f"(exit status {self.proc.poll()}); output:\n"
                                         f"{self.output[-3000:]}")
                self._changed.wait(min(left, 0.2))

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def wait(self, timeout: float) -> int:
        status = self.proc.wait(timeout)
        self._reader.join(5)
        Proc.running.discard(self.proc.pid)
        return status

    def stop(self, grace: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL after ``grace`` seconds; every process of its session too
        (the demo's agents), each by pid."""
        family = _family(self.proc.pid)
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait(10)
        for child in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.wait(grace)
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        self._reader.join(5)
        Proc.running.discard(self.proc.pid)
        return self.proc.returncode


def _family(pid: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.NoSuchProcess):
        return psutil.Process(pid).children(recursive=True)
    return []


class Dashboard(Proc):
    """``porter-mesh ui`` on a free port; :attr:`url` is the address it printed."""

    def __init__(self, mesh: str, data_dir: Path, *, log_dir: Path, extra: Sequence[str] = ()
                 ) -> None:
        super().__init__("porter-ui", ["ui", "--mesh", mesh, "--port", "0",
                                       "--data-dir", str(data_dir), *extra], log_dir=log_dir)
        line = self.wait_line(lambda s: s.startswith(URL_LINE), 30, "address line")
        self.url = line[len(URL_LINE):].strip()
        self.base, _, self.token = self.url.partition("/?token=")
        self.port = int(self.base.rsplit(":", 1)[1])


def agent(role: str, name: str, mesh: str, root: Path, *extra: str) -> Proc:
    """An example agent (scripted brain) with its own data dir and a shared workspace."""
    return Proc(name, ["agent", role, "--name", name, "--mesh", mesh,
                       "--data-dir", str(root / "data" / name),
                       "--workspace", str(root / "workspace"),
                       "--heartbeat", "0.25", "--evasive-after", "3", "--expire-after", "8",
                       *extra], log_dir=root / "logs")


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """Headless Debian Chromium under Playwright (never Playwright's own browser build)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=list(CHROMIUM_ARGS))
        try:
            yield browser
        finally:
            browser.close()


class Page:
    """One browser context and page; page errors are collected and checked at close."""

    def __init__(self, browser: Any, url: str | None = None) -> None:
        self.context = browser.new_context(viewport=VIEWPORT)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        self.page.on("console", self._console)
        if url is not None:
            self.page.goto(url)

    def _console(self, msg: Any) -> None:
        # An HTTP error answer is logged by the browser itself; the tests check those.
        if msg.type == "error" and not msg.text.startswith("Failed to load resource"):
            self.errors.append(f"console: {msg.text}")

    def close(self, *, check: bool = True) -> None:
        self.context.close()
        if check:
            assert not self.errors, f"the page reported errors: {self.errors}"


def helpers() -> set[int]:
    """Pids of Playwright's driver and every process under it (Chromium and its helpers),
    and of every process under a running :class:`Proc` (not the Proc itself)."""
    family: set[int] = set()
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.NoSuchProcess):
            driver = any("playwright" in part for part in child.cmdline())
            if driver:
                family.add(child.pid)
            if driver or child.pid in Proc.running:
                family.update(p.pid for p in child.children(recursive=True))
    return family


def settle_children(before: set[int], timeout: float = 15.0) -> None:
    """Wait until the browser's helper processes started during a test have ended."""
    me = psutil.Process()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        extra = []
        for child in me.children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                if child.pid not in before and child.status() != psutil.STATUS_ZOMBIE:
                    extra.append(child)
        if not extra:
            return
        psutil.wait_procs(extra, timeout=0.2)


def send_offer(page: Any, agent: str, text: str, timeout_ms: float = 30_000) -> None:
    """Offer ``text`` to ``agent`` from the page's compose box; wait until it says sent."""
    from playwright.sync_api import expect

    page.get_by_test_id("compose-target").fill(f"@{agent}")
    page.get_by_test_id("compose-type").select_option("Offer")
    page.get_by_test_id("compose-text").fill(text)
    page.get_by_test_id("compose-send").click()
    expect(page.get_by_test_id("compose-status")).to_contain_text(f"sent Offer to @{agent}",
                                                                  timeout=timeout_ms)
