"""The dashboard's web server: a Starlette app that serves one page and JSON read from run stores.

Safety, because a run directory is the user's data and the server may be reachable:
* only GET (and HEAD) routes exist; anything else is 405;
* run names must look like evo run names and resolve to a directory directly inside the runs
  directory, not through a symbolic link (`RunsDir`); anything else is 404, so `../`, absolute
  paths and encoded traversal never reach the file system;
* static files come from a fixed table of names (the page, its script and style, and plotly.js
  from the installed `plotly` package), never from a path in the request;
* the Host header must name this server (no DNS-rebinding reads from another web site), and
  responses carry a content security policy that allows only this origin.
"""

from __future__ import annotations

import asyncio
import io
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from dashboards import data
from dashboards.data import RunsDir
from evo.runstore import RunStore

__all__ = ["create_app", "plotly_js"]

STATIC = Path(__file__).parent / "static"
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")

_CSP = ("default-src 'self'; script-src 'self' 'unsafe-eval'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data: blob:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
_ICON = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><circle cx="8" cy="8" r="7" fill="#2563eb"/>'
         '<circle cx="8" cy="8" r="3" fill="#fff"/></svg>')
_HEADERS = {"Content-Security-Policy": _CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
            "X-Frame-Options": "DENY", "Cache-Control": "no-store"}


def plotly_js() -> Path:
    """plotly.js as shipped inside the installed `plotly` wheel (no CDN: the page works offline)."""
    import plotly

    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the installed plotly package has no plotly.min.js; reinstall 'evo[dashboard]'")
    return path


def _static_files() -> dict[str, tuple[Path, str]]:
    return {"app.js": (STATIC / "app.js", "text/javascript"), "style.css": (STATIC / "style.css", "text/css"),
            "plotly.min.js": (plotly_js(), "text/javascript")}


def _json(payload: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(payload, status_code=status, headers=_HEADERS)


def _not_found(what: str) -> JSONResponse:
    return _json({"error": f"not found: {what}"}, 404)


def create_app(runs_dir: str | Path, default_run: str | None = None, hosts: list[str] | None = None,
               poll_ms: int = 1500) -> Starlette:
    """The app for every run directly inside `runs_dir` (`default_run`: the run the page opens on).
    `hosts`: the Host header values accepted (default: the loopback names)."""
    runs = RunsDir(runs_dir)
    static = _static_files()
    page = (STATIC / "index.html").read_text()

    def with_run(view: Callable[[RunStore, Request], Any]) -> Callable[[Request], Any]:
        """A run's view: resolve the name safely, open the store read-only, compute off the event loop."""
        async def endpoint(request: Request) -> Response:
            name = request.path_params["run"]
            if runs.run_path(name) is None:
                return _not_found(f"run {name!r}")

            def work() -> Any:
                store = runs.open(name)
                try:
                    return view(store, request)
                finally:
                    store.close()
            result = await asyncio.to_thread(work)
            return result if isinstance(result, Response) else _json(result)
        return endpoint

    async def index(request: Request) -> Response:
        return Response(page, media_type="text/html", headers=_HEADERS)

    async def favicon(request: Request) -> Response:  # browsers ask for it whatever the page says
        return Response(_ICON, media_type="image/svg+xml", headers={**_HEADERS, "Cache-Control": "max-age=86400"})

    async def static_file(request: Request) -> Response:
        entry = static.get(request.path_params["name"])
        if entry is None:
            return _not_found("static file")
        return FileResponse(entry[0], media_type=entry[1], headers={**_HEADERS, "Cache-Control": "max-age=3600"})

    async def config(request: Request) -> Response:
        return _json({"default_run": default_run, "poll_ms": poll_ms, "runs_dir": str(runs.root)})

    def list_runs() -> list[dict[str, Any]]:
        out = []
        for name in runs.names():
            store = runs.open(name)
            if store is None:
                continue
            try:
                out.append(data.run_summary(store))
            except Exception as exc:  # one unreadable run must not hide the others
                out.append({"name": name, "status": f"unreadable ({type(exc).__name__})"})
            finally:
                store.close()
        return out

    async def runs_view(request: Request) -> Response:
        return _json(await asyncio.to_thread(list_runs))

    def member(store: RunStore, request: Request) -> Any:
        try:
            index = int(request.path_params["member"])
        except ValueError:
            return _not_found("member")
        detail = data.member_detail(store, index)
        return detail if detail is not None else _not_found(f"member {index}")

    def export(store: RunStore, request: Request) -> Response:
        from evo.export import export_member

        raw = request.query_params.get("member")
        if raw is not None and not raw.isdigit():
            return _json({"error": "member: expected a member index"}, 400)
        try:
            row, checkpoint, _ = store.trained_checkpoint(None if raw is None else int(raw))
        except Exception as exc:
            return _json({"error": str(exc)}, 404)
        if not checkpoint.resolve().is_relative_to(store.path):  # the database names a file outside the run
            return _not_found("checkpoint")
        with tempfile.TemporaryDirectory(prefix="evo-dashboard-export-") as tmp:
            try:
                _, out = export_member(store, Path(tmp) / "export", row["index"])
            except Exception as exc:
                return _json({"error": f"{type(exc).__name__}: {exc}"}, 500)
            buf = io.BytesIO()
            with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
                for f in sorted(out.rglob("*")):
                    if f.is_file():
                        zf.write(f, f.relative_to(out).as_posix())
        filename = f"{store.name}-member{row['index']}-export.zip"
        return Response(buf.getvalue(), media_type="application/zip",
                        headers={**_HEADERS, "Content-Disposition": f'attachment; filename="{filename}"'})

    def leaderboard_csv(store: RunStore, request: Request) -> Response:
        from evo.leaderboard import leaderboard_rows, render

        return Response(render(leaderboard_rows(store), "csv"), media_type="text/csv",
                        headers={**_HEADERS, "Content-Disposition": f'attachment; filename="{store.name}-leaderboard.csv"'})

    views: dict[str, Callable[[RunStore, Request], Any]] = {
        "summary": lambda s, r: data.run_summary(s), "version": lambda s, r: data.version(s),
        "leaderboard": lambda s, r: data.leaderboard(s), "fitness": lambda s, r: data.fitness(s),
        "lineage": lambda s, r: data.lineage(s), "schedule": lambda s, r: data.schedule(s),
        "parallel": lambda s, r: data.parallel(s), "mutations": lambda s, r: data.mutation_effects(s),
    }
    routes = [
        Route("/", index, methods=["GET"]),
        Route("/favicon.ico", favicon, methods=["GET"]),
        Route("/static/{name}", static_file, methods=["GET"]),
        Route("/api/config", config, methods=["GET"]),
        Route("/api/runs", runs_view, methods=["GET"]),
        *[Route(f"/api/runs/{{run}}/{view}", with_run(fn), methods=["GET"]) for view, fn in views.items()],
        Route("/api/runs/{run}/members/{member}", with_run(member), methods=["GET"]),
        Route("/api/runs/{run}/export", with_run(export), methods=["GET"]),
        Route("/api/runs/{run}/leaderboard.csv", with_run(leaderboard_csv), methods=["GET"]),
    ]
    allowed = list(hosts or LOCAL_HOSTS)
    return Starlette(routes=routes, middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=allowed)])
