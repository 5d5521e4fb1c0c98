"""Drive headless Chromium from tests: open a local page from ``file://``, let its
scripts run, and read back the DOM, the console and what a probe recorded.

No WebDriver is needed: ``chromium --headless --dump-dom`` prints the DOM after the
page's scripts ran (``--virtual-time-budget`` lets React's scheduled render finish
first), ``--enable-logging=stderr`` prints console messages, and ``--screenshot``
writes a PNG. The probe is a script put at the top of a copy of the page (beside it,
so relative paths still resolve): it records uncaught errors, failed resource loads,
``console.error``/``console.warn``, unhandled rejections and any ``alert``/``confirm``/
``prompt``/``window.open`` call into an attribute of ``<html>`` that the dumped DOM
carries. Host names resolve to nothing, so a page that tries the network shows it.
"""

import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pytest

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

INSTALL_HINT = ("install it with `apt-get install chromium` (Debian) or set "
                "POSKERNEL_CHROMIUM to a Chromium/Chrome binary")


def find_chromium() -> str | None:
    """The Chromium binary: ``$POSKERNEL_CHROMIUM`` if set, else the first on PATH."""
    explicit = os.environ.get("POSKERNEL_CHROMIUM")
    if explicit:
        return explicit if shutil.which(explicit) else None
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def require_chromium() -> str:
    """The Chromium binary, or skip the calling test saying why."""
    path = find_chromium()
    if path is None:
        pytest.skip(f"headless Chromium not found ({', '.join(CANDIDATES)}): {INSTALL_HINT}")
    return path


PROBE_JS = """(function () {
  var log = [], root = document.documentElement;
  function rec(kind, msg) {
    log.push({kind: kind, msg: String(msg).slice(0, 500)});
    root.setAttribute("data-pk-probe", JSON.stringify(log));
  }
  root.setAttribute("data-pk-probe", "[]");
  window.addEventListener("error", function (e) {
    var t = e.target;
    if (t && t !== window && t.tagName) { rec("resource", t.tagName + " " + (t.src || t.href)); }
    else { rec("error", e.message + " at " + e.filename + ":" + e.lineno); }
  }, true);
  window.addEventListener("unhandledrejection", function (e) { rec("rejection", e.reason); });
  ["alert", "confirm", "prompt", "print", "open"].forEach(function (name) {
    window[name] = function (m) { rec("dialog", name + ": " + m); };
  });
  ["error", "warn"].forEach(function (level) {
    var orig = console[level];
    console[level] = function () {
      rec("console." + level, Array.prototype.join.call(arguments, " "));
      return orig.apply(console, arguments);
    };
  });
})();"""


def _with_probe(text: str) -> str:
    """``text`` with the probe as the first script (after ``<meta charset>`` if any)."""
    tag = f"<script>{PROBE_JS}</script>"
    for pattern in (r"<meta\s+charset[^>]*>", r"<head[^>]*>"):
        match = re.search(pattern, text, flags=re.IGNORECASE)
        if match:
            return text[: match.end()] + tag + text[match.end():]
    return tag + text


# ------------------------------------------------------------------- a small DOM

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta",
        "param", "source", "track", "wbr"}


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    children: list["Node | str"] = field(default_factory=list)

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def iter(self):
        yield self
        for child in self.children:
            if isinstance(child, Node):
                yield from child.iter()

    def find_all(self, tag: str | None = None, **attrs: str) -> list["Node"]:
        """Descendants (and self) with this tag and attributes; ``class_`` matches one
        class name, other attributes match exactly (``_`` in a name stands for ``-``)."""
        out = []
        for node in self.iter():
            if tag is not None and node.tag != tag:
                continue
            ok = True
            for key, value in attrs.items():
                if key == "class_":
                    ok &= value in node.attrs.get("class", "").split()
                else:
                    ok &= node.attrs.get(key.replace("_", "-")) == value
            if ok:
                out.append(node)
        return out


class _Builder(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag, attrs):
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag, attrs):
        self.stack[-1].children.append(Node(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data):
        self.stack[-1].children.append(data)


def parse_html(text: str) -> Node:
    builder = _Builder()
    builder.feed(text)
    builder.close()
    return builder.root


# ------------------------------------------------------------------ running Chromium


@dataclass
class PageRun:
    """What a page did in the browser."""

    dom: Node          # the DOM after scripts ran
    dom_text: str      # its serialization, as Chromium printed it
    probe: list[dict]  # probe records: {"kind": ..., "msg": ...}
    console: list[str]  # console messages Chromium logged


def _chromium(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    binary = require_chromium()
    with tempfile.TemporaryDirectory(prefix="pk-chromium-") as profile:
        cmd = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
               "--disable-extensions", "--hide-scrollbars", f"--user-data-dir={profile}",
               "--host-resolver-rules=MAP * ~NOTFOUND", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              encoding="utf-8", errors="replace")


def load_page(path: str | os.PathLike, *, budget_ms: int = 2000,
              timeout: float = 90, fragment: str = "",
              size: tuple[int, int] | None = None) -> PageRun:
    """Open ``path`` from ``file://`` in headless Chromium with the probe and return
    the DOM, probe records and console messages after ``budget_ms`` of virtual time.
    ``fragment``: the part after ``#`` of the address (a permalink); ``size``: the
    window's width and height in pixels (Chromium's default when None)."""
    path = Path(path).resolve()
    probed = path.with_name(f".probe-{path.name}")
    probed.write_text(_with_probe(path.read_text(encoding="utf-8")), encoding="utf-8")
    uri = probed.as_uri() + (f"#{fragment}" if fragment else "")
    try:
        window = [f"--window-size={size[0]},{size[1]}"] if size else []
        proc = _chromium(["--enable-logging=stderr", "--v=0", *window,
                          f"--virtual-time-budget={budget_ms}", "--dump-dom", uri], timeout)
    finally:
        probed.unlink(missing_ok=True)
    if proc.returncode != 0 or "<html" not in proc.stdout:
        raise RuntimeError(f"chromium failed (rc={proc.returncode}): {proc.stderr[-2000:]}")
    dom = parse_html(proc.stdout)
    html_nodes = dom.find_all("html")
    raw = html_nodes[0].attrs.get("data-pk-probe") if html_nodes else None
    if raw is None:
        raise RuntimeError("the probe did not run: no data-pk-probe attribute on <html>")
    console = [m.group(1) for m in re.finditer(r":CONSOLE[^\]]*\]\s*(.*)", proc.stderr)]
    return PageRun(dom=dom, dom_text=proc.stdout, probe=json.loads(raw), console=console)


def screenshot(path: str | os.PathLike, out: str | os.PathLike, *,
               size: tuple[int, int] = (1400, 2000), budget_ms: int = 2000,
               timeout: float = 90, fragment: str = "") -> Path:
    """Render ``path`` from ``file://`` (``#fragment`` appended when given) and write a PNG
    of the window to ``out``."""
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    uri = Path(path).resolve().as_uri() + (f"#{fragment}" if fragment else "")
    proc = _chromium([f"--screenshot={out}", f"--window-size={size[0]},{size[1]}",
                      f"--virtual-time-budget={budget_ms}", uri], timeout)
    if proc.returncode != 0 or not out.is_file():
        raise RuntimeError(f"chromium screenshot failed (rc={proc.returncode}): "
                           f"{proc.stderr[-2000:]}")
    return out
