"""The HAProxy ingress, hardened: what Ray 2.60's generated HAProxy config does not let us set.

Ray's HAProxy mode writes its config from a fixed template. That template binds the stats page to
`*:8404` and the Prometheus endpoint to `:9101` (every interface, no auth), makes the admin socket
world-writable (`mode 666 level admin`), keeps idle clients for an hour (`timeout client 3600s`), has
no `timeout http-request` (a client may send half a body and hold the connection), forwards a request
before its body has arrived, and answers HAProxy's and Serve's own errors in plain text. None of these
is a setting; only the ports, the file paths, the client timeout and the binary's path are
(environment variables of the Ray instance).

So genrec points Ray at a small wrapper as the HAProxy binary (`RAY_SERVE_HAPROXY_BINARY_PATH`). The
wrapper rewrites the config file Ray just wrote (`harden`), asks the kernel to end HAProxy when the
process that started it dies (an HAProxy orphaned by a killed Serve used to keep the app's port), and
execs the real binary with the same arguments (Ray finds its processes by the config path in their
command line, which stays the same):

* stats and Prometheus listen on 127.0.0.1 only, on ports chosen per app (two apps coexist);
* the admin socket is owner-only (mode 600, in a 0700 runtime folder removed at shutdown);
* `timeout http-request` (the whole request, body included) and `timeout client` come from the serve
  config (`body_timeout_s`, `client_timeout_s`), and `http-request wait-for-body` makes HAProxy wait
  for a complete body before it occupies a replica;
* an HTTP/1.1 request without Host or with an unknown HTTP version is refused (400), and a
  /recommend body announced over the app's limit gets 413 before any `100 Continue` (`edge_rules`);
* every request it forwards carries the app's front-door key (`front_door_rules`, front_door.py), so
  replicas refuse what reaches them any other way (their own port, Serve's fallback proxy);
* every error HAProxy answers itself (400, 404, 408, 413, 500, 502, 503, 504) and every non-JSON
  error a replica or Serve answers is the app's JSON shape `{"detail": "..."}`; a replica that dies
  mid-request gives the client a JSON 503 with Retry-After, never a hang.

Everything here is standard library only: the wrapper runs as its own short-lived Python process.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from genrec.platform.serve.front_door import FRONT_DOOR_HEADER

SETTINGS_ENV = "GENREC_HAPROXY_SETTINGS"  # path of the wrapper's settings (GuardSettings as JSON)
LOCAL_SECTIONS = ("listen stats", "frontend prometheus")  # their binds go to 127.0.0.1
ERROR_CODES = (400, 404, 405, 408, 413, 429, 500, 502, 503, 504)
REASONS = {
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    413: "Payload Too Large",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}
DETAILS = {
    400: "the request is not valid HTTP; send JSON with a Content-Length",
    404: "no such path; this app serves POST /recommend, POST /rank, GET /health, /decoders, "
    "/constraint-sets",
    405: "method not allowed for this path (POST /recommend, POST /rank; GET for the others)",
    408: "the request (headers and body) did not arrive within the http-request timeout of the ingress; "
    "send it at once",
    413: "the request is too large",
    429: "too many requests; retry after the Retry-After seconds",
    500: "internal error in a replica; see the log of the replica",
    502: "no replica could answer (one stopped or restarted mid-request); retry",
    503: "no replica can take the request now (overloaded, starting or restarting); retry after the "
    "Retry-After seconds",
    504: "no replica answered in time; retry later",
}
# HAProxy answers a server that died mid-request with 502; the client gets what the app documents for
# "try again": 503 with Retry-After.
ERRORFILE_STATUS = {502: 503}
UPSTREAM_STATUS = {500: 503, 502: 503}
UPSTREAM_DETAILS = {
    500: "a replica failed while handling the request (it may be restarting); retry after the Retry-After "
    "seconds",
    502: DETAILS[502],
}


@dataclass(frozen=True)
class GuardSettings:
    real_binary: str  # the HAProxy binary Ray would have run
    runtime_dir: str  # the app's private folder: config, sockets, error pages
    http_request_timeout_s: float  # HAProxy `timeout http-request`: the whole request, body included
    client_timeout_s: float  # HAProxy `timeout client`: an idle client connection
    retry_after_s: int = 1
    front_door_key: str = ""  # set on every forwarded request (front_door.py); '' sets nothing

    @property
    def error_dir(self) -> Path:
        return Path(self.runtime_dir) / "errors"

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def load(cls, path: str | os.PathLike) -> GuardSettings:
        return cls(**json.loads(Path(path).read_text()))


def json_detail(status: int) -> str:
    return json.dumps({"detail": DETAILS[status]})


def error_page(status: int, retry_after_s: int) -> str:
    """An HAProxy errorfile: the whole raw HTTP response, JSON body."""
    shown = ERRORFILE_STATUS.get(status, status)
    body = json.dumps({"detail": DETAILS[status]})
    headers = [
        f"HTTP/1.1 {shown} {REASONS[shown]}",
        "Content-Type: application/json",
        "Cache-Control: no-cache",
        "Connection: close",
        f"Content-Length: {len(body)}",
    ]
    if shown in (429, 503):
        headers.append(f"Retry-After: {retry_after_s}")
    return "\r\n".join(headers) + "\r\n\r\n" + body


def write_error_pages(settings: GuardSettings) -> None:
    settings.error_dir.mkdir(parents=True, exist_ok=True)
    for status in ERROR_CODES:
        (settings.error_dir / f"{status}.http").write_text(error_page(status, settings.retry_after_s))


def _ms(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


def json_response_rules(retry_after_s: int) -> list[str]:
    """http-response rules that replace a non-JSON error from a replica (Serve's own plain-text 503
    "Request dropped due to backpressure", a 500 "Internal Server Error", ...) with the JSON shape,
    keeping its status. `http-response return` drops the original response before it builds the new
    one, so Retry-After cannot be copied from it (a `%[res.hdr()]` there makes HAProxy close the
    connection): 429 and 503 get the deployment's `retry_after_s`."""
    rules = ["    acl genrec_json_body res.hdr(content-type) -m sub json"]
    for status in ERROR_CODES:
        # the app answers its own errors in JSON: a plain-text 500/502 is Serve's (a replica died under
        # the request), which the client should retry like a 503
        shown = UPSTREAM_STATUS.get(status, status)
        detail = UPSTREAM_DETAILS.get(status, DETAILS[status])
        retry = f" hdr Retry-After {retry_after_s}" if shown in (429, 503) else ""
        rules.append(
            f"    http-response return status {shown} content-type application/json "
            f"string '{json.dumps({'detail': detail})}'{retry} if {{ status {status} }} !genrec_json_body"
        )
    return rules


RECOMMEND_MAX_BODY_BYTES = 1 << 20  # = serve.requests.MAX_BODY_BYTES (not imported: stdlib only here)


def edge_rules(http_request_timeout_s: float) -> list[str]:
    """http-request rules judged on the request line and headers alone, before HAProxy asks for or
    waits for a body: an HTTP/1.1 request without Host and an unknown HTTP version get a JSON 400, and
    a /recommend body announced over the app's limit a JSON 413 at once, never `100 Continue` first
    (the replica would refuse it anyway, after the client had sent it all). Then HAProxy waits for
    the whole body (`wait-for-body`, here rather than `option http-buffer-request`, which waits
    before any rule is judged), so only complete requests occupy a replica."""
    return [
        "    http-request deny deny_status 400 if { req.ver 1.1 } !{ req.hdr_cnt(host) gt 0 }",
        "    http-request deny deny_status 400 if !{ req.ver 1.0 } !{ req.ver 1.1 } !{ req.ver 2.0 }",
        "    http-request deny deny_status 413 if { path /recommend } "
        f"{{ req.hdr_val(content-length) gt {RECOMMEND_MAX_BODY_BYTES} }}",
        f"    http-request wait-for-body time {_ms(http_request_timeout_s)}",
    ]


def split_sections(text: str) -> list[tuple[str, list[str]]]:
    """(header, lines) per config section; a header is a line that starts without indentation."""
    sections: list[tuple[str, list[str]]] = [("", [])]
    for line in text.splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            sections.append((line.strip(), [line]))
        else:
            sections[-1][1].append(line)
    return sections


BIND_ANY = re.compile(r"^(\s*)bind\s+(?:\*|0\.0\.0\.0|::|\[::\])?:(\d+)(.*)$")
SOCKET_MODE = re.compile(r"^(\s*stats socket\s+\S+.*?\bmode\s+)\d+(.*)$")


def harden(text: str, settings: GuardSettings) -> str:
    """Ray's generated HAProxy config -> the same config with the changes listed in the module doc.
    Idempotent (HAProxy is restarted with the same file on every reload)."""
    out: list[str] = []
    for header, lines in split_sections(text):
        if header == "global":
            lines = [SOCKET_MODE.sub(r"\g<1>600\g<2>", line) for line in lines]
        elif header == "defaults":
            lines = _harden_defaults(lines, settings)
        elif header in LOCAL_SECTIONS:
            lines = [BIND_ANY.sub(r"\g<1>bind 127.0.0.1:\g<2>\g<3>", line) for line in lines]
        elif header == "frontend http_frontend":
            lines = _with_json_rules(lines, settings)
        elif header == "backend default_backend":
            not_found = (
                "    http-request return status 404 content-type application/json "
                f"string '{json_detail(404)}'"
            )
            lines = [not_found if "http-request return status 404" in line else line for line in lines]
        elif header.startswith("backend "):
            # `always` sends a client's first request over an idle connection to a replica; when that
            # replica has just died HAProxy closes the client's connection without an answer. `safe`
            # (HAProxy's default) sends first requests on fresh connections, which get a 503.
            lines = [line.replace("http-reuse always", "http-reuse safe") for line in lines]
        out.extend(lines)
    return "\n".join(out) + "\n"


def _harden_defaults(lines: list[str], settings: GuardSettings) -> list[str]:
    dropped = ("timeout client", "timeout http-request", "errorfile ", "option http-buffer-request")
    kept = [line for line in lines if not line.strip().startswith(dropped) and line.strip() != "# genrec"]
    added = [
        "    # genrec",
        f"    timeout client {_ms(settings.client_timeout_s)}",
        f"    timeout http-request {_ms(settings.http_request_timeout_s)}",
        *(f"    errorfile {code} {settings.error_dir / f'{code}.http'}" for code in ERROR_CODES),
    ]
    return kept[:1] + added + kept[1:]


def front_door_rules(key: str) -> list[str]:
    """The key on every request this frontend forwards (to a replica or to Serve's fallback proxy),
    replacing any copy the client sent: replicas serve only requests that carry it (front_door.py).
    Judged after the edge rules and `wait-for-body`, so only complete requests get it. HAProxy's
    health checks ask Serve's `/-/healthz`, which Serve answers before the app: they need no key."""
    if not key:
        return []
    return [
        f"    http-request del-header {FRONT_DOOR_HEADER}",
        f"    http-request set-header {FRONT_DOOR_HEADER} {key}",
    ]


def _with_json_rules(lines: list[str], settings: GuardSettings) -> list[str]:
    if any("genrec_json_body" in line for line in lines):
        return lines
    first_bind = next((i for i, line in enumerate(lines) if line.strip().startswith("bind ")), 0)
    rules = (
        json_response_rules(settings.retry_after_s)
        + edge_rules(settings.http_request_timeout_s)
        + front_door_rules(settings.front_door_key)
    )
    return lines[: first_bind + 1] + rules + lines[first_bind + 1 :]


def config_path(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv[:-1]):
        if arg == "-f":
            return argv[i + 1]
    return None


def die_with_parent() -> None:
    """PR_SET_PDEATHSIG: SIGTERM this process (HAProxy, after exec) when its parent dies."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):  # not Linux: the shutdown sweep in server.py still ends it
        pass


def processes_mentioning(text: str) -> list[int]:
    """Pids whose command line contains `text` (Linux /proc; empty elsewhere), this one excluded."""
    pids = []
    needle = text.encode()
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if needle in (entry / "cmdline").read_bytes() and int(entry.name) != os.getpid():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def stop_processes(pids: list[int], wait_s: float) -> None:
    """SIGTERM, then SIGKILL what is still there after `wait_s`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if Path(f"/proc/{p}").exists() and not _zombie(p)]
            time.sleep(0.05)
        if not pids:
            return


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def start_watchdog(parent: int, runtime_dir: Path) -> subprocess.Popen:
    """A process outside `parent`'s session that, once `parent` is gone, ends any HAProxy still running
    from `runtime_dir` and deletes the folder (signals to `parent`'s group do not reach it)."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "genrec.platform.serve.haproxy_guard",
            "--watch",
            str(parent),
            str(runtime_dir),
        ],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        close_fds=True,
    )


def watch(parent: int, runtime_dir: str, poll_s: float = 0.2) -> None:
    """The watchdog: wait until `parent` exits (this process is then re-parented) or the folder is
    removed by a clean shutdown, then clean up what is left."""
    folder = Path(runtime_dir)
    while os.getppid() == parent and folder.is_dir():
        time.sleep(poll_s)
    if folder.is_dir():
        stop_processes(processes_mentioning(str(folder)), wait_s=5.0)
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    """The wrapper's entry point: harden the config named by `-f`, then exec the real HAProxy."""
    argv = list(sys.argv[1:] if argv is None else argv)
    settings = GuardSettings.load(os.environ[SETTINGS_ENV])
    cfg = config_path(argv)
    if cfg is not None and Path(cfg).is_file():
        text = Path(cfg).read_text()
        hardened = harden(text, settings)
        if hardened != text:
            Path(cfg).write_text(hardened)
    die_with_parent()
    os.execvp(settings.real_binary, [settings.real_binary, *argv])


if __name__ == "__main__":
    if sys.argv[1:2] == ["--watch"]:
        watch(int(sys.argv[2]), sys.argv[3])
    else:
        main()
