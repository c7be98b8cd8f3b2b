"""``trainrun explore DIR...``: the trade-off curves of runs and sweeps as one self-contained web
page (plotly.js inlined: it opens from disk with no network), written to a file or served on
127.0.0.1. The page's data and frontiers: :mod:`trainrun.report.explorer`; its drawing:
``trainrun/report/explorer.js``."""

from __future__ import annotations

import argparse
import math
import sys
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from trainrun.atomic_io import atomic_write_text
from trainrun.errors import ConfigError
from trainrun.report.explorer import page, page_data, published_runs, series_of
from trainrun.report.runs import chosen_baseline, find_runs, load_run, pricing_from_flags
from trainrun.run_files import check_output_file

DEFAULT_PORT = 8050
PAGE_NAME = "explorer.html"


def explore_command(argv: list[str]) -> int:
    """Entry point of ``trainrun explore``."""
    args = _parser().parse_args(argv)
    out = args.out
    if out is None and args.serve is None:
        out = (args.dirs[0] if len(args.dirs) == 1 else Path(".")) / PAGE_NAME
    if out is not None:
        check_output_file("--out", out)
    server = None if args.serve is None else _bind(args.host, args.serve)  # a taken port: before any work
    pricing = pricing_from_flags(args.hardware, None)
    drawn, notes = [], []
    for path in find_runs(args.dirs):
        run, _ = load_run(path, pricing=pricing)
        if run.status == "completed" and None not in (run.quality, run.train_seconds) and math.isfinite(run.quality):
            drawn.append((run, series_of(run)))
        else:
            notes.append(f"{path}: {run.status}, not drawn")
    if not drawn:
        raise ConfigError(f"no completed run under {', '.join(map(str, args.dirs))} ({'; '.join(notes)})")
    baseline = chosen_baseline(args.baseline, sorted({run.label for run, _ in drawn}))
    published, left_out = ([], []) if args.no_published else published_runs()
    html = page(page_data(drawn + published, baseline, notes + left_out))
    print(f"{len(drawn)} runs, {len(published)} published points; {len(notes)} runs not drawn")
    if out is not None:
        atomic_write_text(out, html)
        print(f"wrote {out}")
    if server is not None:
        _serve(server, html.encode("utf-8"))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainrun explore",
        description="The trade-off curves of runs and sweeps as one web page: filter, hover, time or cost, "
        "time and speed-up to a target quality, beside the published points.",
    )
    parser.add_argument("dirs", nargs="+", type=Path, help="run, sweep or multirun directories")
    parser.add_argument("--baseline", help="the recipe speed-ups are measured against (default: 'baseline')")
    parser.add_argument("--hardware", help="price every run as this conf/hardware option instead of its own")
    parser.add_argument(
        "--out", type=Path, help=f"the page to write (default: DIR/{PAGE_NAME} for one DIR, else ./{PAGE_NAME})"
    )
    parser.add_argument(
        "--serve",
        nargs="?",
        type=_port,
        const=DEFAULT_PORT,
        metavar="PORT",
        help=f"serve the page on --host at PORT (default {DEFAULT_PORT}; 0: any free port) until Ctrl-C",
    )
    parser.add_argument("--host", default="127.0.0.1", help="the interface --serve listens on (default: 127.0.0.1)")
    parser.add_argument("--no-published", action="store_true", help="leave out the published points trainrun ships")
    return parser


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"'{text}' is not a port (0 to 65535)")
    return int(text)


class PageServer(ThreadingHTTPServer):
    """The page's server: a browser that goes away mid-page (a reload, a closed tab) is no error."""

    daemon_threads = True

    def handle_error(self, request: object, client_address: tuple) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # BrokenPipeError, ConnectionResetError
            super().handle_error(request, client_address)


def _bind(host: str, port: int) -> PageServer:
    try:
        return PageServer((host, port), PageHandler)
    except OSError as error:
        raise ConfigError(f"bad value for '--serve': cannot listen on {host}:{port} ({error.strerror})") from None


class PageHandler(BaseHTTPRequestHandler):
    """Answers ``GET /`` with the page and every other path with 404: nothing on disk is served."""

    page: bytes = b""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path.split("?", 1)[0] != "/":
            self.send_error(HTTPStatus.NOT_FOUND)
            return
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(self.page)))
        self.end_headers()
        self.wfile.write(self.page)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's signature)
        """Requests are not logged: the console keeps the one line that says where the page is."""


def _serve(server: PageServer, html: bytes) -> None:
    PageHandler.page = html
    host, port = server.server_address[:2]
    print(f"serving http://{host}:{port}/ (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
    finally:
        server.server_close()
