"""The dashboard's JSON API, in-process, on a real run directory made by a tiny `evo run`; and its
safety over real HTTP: only GET, no path outside the runs directory, no foreign Host."""

from __future__ import annotations

import http.client
import io
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from starlette.testclient import TestClient

import agents
from dashboards.server import create_app
from evo.cli import main
from evo.leaderboard import leaderboard_rows, render
from evo.runstore import RunStore
from tests.conftest import REPO, evo_command
from tests.dashboards.conftest import serve


@pytest.fixture(scope="module")
def client(toy_runs: Path) -> TestClient:
    return TestClient(create_app(toy_runs), base_url="http://127.0.0.1")


def db_rows(run_dir: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(run_dir / "run.sqlite") as db:
        return db.execute(sql).fetchall()


def test_runs_and_summary(client: TestClient, toy_runs: Path) -> None:
    runs = client.get("/api/runs").json()
    assert [r["name"] for r in runs] == ["toy"]
    r = runs[0]
    assert r["status"] == "completed" and r["generations_done"] == 3 and r["generations"] == 3
    assert r["agent"] == "tests.toy_agent:ToyAgent" and r["population"] == 4 and r["created_at"] > 0
    best = db_rows(toy_runs / "toy", "SELECT best_score FROM generations WHERE generation = 2")[0][0]
    assert r["best_score"] == pytest.approx(best)
    assert client.get("/api/runs/toy/version").json()["generations_done"] == 3


def test_leaderboard_is_the_engines(client: TestClient, toy_runs: Path) -> None:
    data = client.get("/api/runs/toy/leaderboard").json()
    store = RunStore.open("toy", toy_runs, read_only=True)
    rows = leaderboard_rows(store)
    assert [r["member"] for r in data["rows"]] == [r["member"] for r in rows]
    assert [r["score"] for r in data["rows"]] == pytest.approx([r["score"] for r in rows])
    first = data["rows"][0]
    assert first["fitness_history"] == store.evaluations()[0]["history"]
    assert [g for g, _ in first["score_history"]] == sorted(g for (g,) in db_rows(
        toy_runs / "toy", f"SELECT generation FROM evaluations WHERE idx = {first['member']}"))
    # what varies is what differs between members; weight_decay is fixed in toy.toml
    assert "weight_decay" not in data["varying_hparams"]
    for key in data["varying_hparams"]:
        assert len({json.dumps(r["hparams"][key]) for r in data["rows"]}) > 1
    csv_text = client.get("/api/runs/toy/leaderboard.csv").text
    assert csv_text == render(rows, "csv")
    store.close()


def test_fitness_lineage_schedule_parallel_and_mutations(client: TestClient, toy_runs: Path) -> None:
    run = toy_runs / "toy"
    evaluations = db_rows(run, "SELECT generation, idx, fitness FROM evaluations")
    fit = client.get("/api/runs/toy/fitness").json()
    assert len(fit["points"]) == len(evaluations) == 12
    for g in fit["generations"]:
        fits = [f for gen, _, f in evaluations if gen == g["generation"]]
        assert g["median_fitness"] == pytest.approx(statistics.median(fits))
    founders = {i for (i,) in db_rows(run, "SELECT idx FROM members WHERE parent IS NULL")}
    assert {p["lineage"] for p in fit["points"]} <= founders

    tree = client.get("/api/runs/toy/lineage").json()
    parents = dict(db_rows(run, "SELECT idx, parent FROM members"))
    assert {n["member"] for n in tree["nodes"]} == set(parents)
    assert {(e["parent"], e["child"]) for e in tree["edges"]} == {(p, c) for c, p in parents.items() if p is not None}
    assert all(e["summary"] and e["kind"] for e in tree["edges"])
    assert len({n["row"] for n in tree["nodes"]}) == len(tree["nodes"])  # one row each

    sched = client.get("/api/runs/toy/schedule").json()
    elite = db_rows(run, "SELECT best_idx FROM generations WHERE generation = 2")[0][0]
    assert sched["elite"] == elite and sched["chain"][-1] == elite and sched["generations"] == [0, 1, 2]
    assert sched["members"][-1] == elite and parents[sched["chain"][0]] is None
    for name, values in sched["hparams"].items():
        assert len(values) == 3 and all(isinstance(v, (int, float)) for v in values), name
    assert "lr" in sched["log_scale"]  # toy.toml declares lr on a log scale

    par = client.get("/api/runs/toy/parallel").json()
    assert sorted(par["members"]) == sorted({i for _, i, _ in evaluations})
    assert all(len(d["values"]) == len(par["members"]) for d in par["dimensions"])

    effects = client.get("/api/runs/toy/mutations").json()
    fitness = {(g, i): f for g, i, f in evaluations}
    born = dict(db_rows(run, "SELECT idx, born FROM members"))
    children = [c for c, p in parents.items() if p is not None and (born[c], c) in fitness]
    assert sorted(e["child"] for e in effects["effects"]) == sorted(children)
    for e in effects["effects"]:
        assert e["delta"] == pytest.approx(fitness[(e["generation"], e["child"])] - fitness[(e["generation"] - 1, e["parent"])])
    assert sum(g["count"] for g in effects["groups"]) == len(children)


def test_member_detail(client: TestClient, toy_runs: Path) -> None:
    run = toy_runs / "toy"
    elite = db_rows(run, "SELECT best_idx FROM generations WHERE generation = 2")[0][0]
    m = client.get(f"/api/runs/toy/members/{elite}").json()
    digests = dict(db_rows(run, f"SELECT generation, digest FROM evaluations WHERE idx = {elite}"))
    assert [e["generation"] for e in m["evaluations"]] == sorted(digests)
    assert [e["digest"] for e in m["evaluations"]] == [digests[g] for g in sorted(digests)]
    assert m["ancestry"][0]["member"] == elite and m["exportable"]
    assert "val_mse" in m["evaluations"][-1]["metrics"] and "loss_mse" in m["evaluations"][-1]["train_metrics"]
    assert client.get("/api/runs/toy/members/99999").status_code == 404
    assert client.get("/api/runs/toy/members/abc").status_code == 404


def test_elite_download_is_what_evo_export_writes(client: TestClient, toy_runs: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    resp = client.get("/api/runs/toy/export")
    assert resp.status_code == 200 and resp.headers["content-type"] == "application/zip"
    assert "attachment" in resp.headers["content-disposition"]
    zipfile.ZipFile(io.BytesIO(resp.content)).extractall(tmp_path / "downloaded")
    monkeypatch.chdir(toy_runs.parent)
    assert main(["export", "toy", "--out", str(tmp_path / "cli")]) == 0
    capsys.readouterr()
    files = lambda root: sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    cli_files, got_files = files(tmp_path / "cli"), files(tmp_path / "downloaded")
    assert got_files == cli_files
    for rel in cli_files:
        assert (tmp_path / "downloaded" / rel).read_bytes() == (tmp_path / "cli" / rel).read_bytes(), rel
    agent = agents.load(tmp_path / "downloaded")
    rows = leaderboard_rows(RunStore.open("toy", toy_runs, read_only=True))
    assert agent.index == rows[0]["member"]
    assert agent.evaluate().fitness == pytest.approx(rows[0]["fitness"], abs=1e-7)
    assert client.get("/api/runs/toy/export?member=../../x").status_code == 400


def test_a_run_without_a_completed_generation_has_every_view(tmp_path: Path) -> None:
    from evo.spec import load_experiment

    exp, text = load_experiment(REPO / "tests" / "experiments" / "toy.toml")
    RunStore.create(tmp_path, "fresh", text, exp.to_json()).close()
    client = TestClient(create_app(tmp_path), base_url="http://127.0.0.1")
    for view in ("summary", "version", "leaderboard", "fitness", "lineage", "schedule", "parallel", "mutations"):
        resp = client.get(f"/api/runs/fresh/{view}")
        assert resp.status_code == 200, (view, resp.text)
    assert client.get("/api/runs/fresh/leaderboard").json()["rows"] == []
    assert client.get("/api/runs/fresh/export").status_code == 404  # nothing to export yet, said plainly
    assert client.get("/api/runs").json()[0]["generations_done"] == 0


def test_reads_never_write_and_never_wait_for_a_writer(client: TestClient, toy_runs: Path) -> None:
    run = toy_runs / "toy"
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name == "run.sqlite"}
    writer = RunStore(run)
    writer._db.execute("BEGIN IMMEDIATE")  # a running `evo run` in the middle of committing a generation
    try:
        t0 = time.perf_counter()
        for view in ("summary", "leaderboard", "fitness", "lineage", "schedule", "parallel", "mutations"):
            assert client.get(f"/api/runs/toy/{view}").status_code == 200, view
        assert time.perf_counter() - t0 < 20  # no view waited out SQLite's 30 s busy timeout
    finally:
        writer._db.execute("ROLLBACK")
        writer.close()
    ro = RunStore.open("toy", toy_runs, read_only=True)
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        ro.set(status="tampered")
    ro.close()
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name == "run.sqlite"} == before


# ---- safety over real HTTP (raw request paths: no client-side normalisation) ------------------------------

def raw_get(base: str, path: str, method: str = "GET", host: str | None = None) -> tuple[int, bytes]:
    u = urlsplit(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    conn.putrequest(method, path, skip_host=host is not None)
    if host is not None:
        conn.putheader("Host", host)
    conn.endheaders()
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp.status, body


@pytest.fixture(scope="module")
def guarded(toy_runs: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A runs directory with the toy run, a run outside it, a symlink to that run, and a run
    directory whose database is a symlink to it."""
    root = tmp_path_factory.mktemp("guarded")
    runs = root / "runs"
    runs.mkdir()
    shutil.copytree(toy_runs / "toy", runs / "toy")
    outside = root / "secret"
    shutil.copytree(toy_runs / "toy", outside)
    (runs / "linked").symlink_to(outside, target_is_directory=True)
    (runs / "dblink").mkdir()
    (runs / "dblink" / "run.sqlite").symlink_to(outside / "run.sqlite")
    return runs, outside


@pytest.mark.parametrize("path", [
    "/api/runs/../../etc/passwd", "/api/runs/..%2F..%2Fetc/summary", "/api/runs/%2e%2e/summary",
    "/api/runs/%2e%2e%2fsecret/summary", "/api/runs/..%252F..%252Fsecret/summary", "/api/runs/%2Fetc%2Fpasswd/summary",
    "/api/runs//etc/passwd/summary", "/api/runs/linked/summary", "/api/runs/linked/export", "/api/runs/dblink/leaderboard",
    "/api/runs/.%2E/secret/summary", "/api/runs/toy%00/summary", "/api/runs/..\\secret/summary",
    "/static/../server.py", "/static/..%2Fserver.py", "/static/%2e%2e%2f%2e%2e%2fpyproject.toml", "/static//etc/passwd",
    "/static/index.html/../../cli.py", "/api/runs/toy/members/..%2F..%2F1",
])
def test_traversal_is_refused(guarded: tuple[Path, Path], path: str) -> None:
    runs, _ = guarded
    with serve(runs) as base:
        status, body = raw_get(base, path)
    assert status in (400, 403, 404), (path, status, body[:200])
    assert b"CREATE TABLE" not in body and b"root:" not in body and b"[project]" not in body


def test_only_get_no_foreign_host_and_no_symlinked_runs_listed(guarded: tuple[Path, Path]) -> None:
    runs, _ = guarded
    with serve(runs) as base:
        status, body = raw_get(base, "/api/runs")
        assert status == 200 and [r["name"] for r in json.loads(body)] == ["toy"]
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            assert raw_get(base, "/api/runs/toy/summary", method)[0] == 405, method
        assert raw_get(base, "/api/runs", host="evil.example")[0] == 400  # DNS rebinding
        status, _ = raw_get(base, "/static/plotly.min.js")
        assert status == 200


def test_evo_dashboard_command_serves_and_warns_off_loopback(toy_runs: Path) -> None:
    """The real console script (the entry-point plugin): starts, serves the API, and warns when it
    binds anything but 127.0.0.1 (here 127.0.0.2: still loopback, so nothing leaves the machine)."""
    for host, warns in (("127.0.0.2", True),):  # one start (an interpreter importing torch) keeps it quick
        with __import__("socket").socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        proc = subprocess.Popen([*evo_command(), "dashboard", str(toy_runs / "toy"), "--host", host, "--port", str(port)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            deadline, status, body = time.monotonic() + 60, None, b""
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    status, body = raw_get(f"http://{host}:{port}", "/api/config", host=f"{host}:{port}")
                    break
                except OSError:
                    time.sleep(0.2)
            assert status == 200, proc.stderr.read() if proc.poll() is not None else "no answer"
            assert json.loads(body)["default_run"] == "toy"  # a run directory opens on that run
        finally:
            proc.terminate()
            out, err = proc.communicate(timeout=20)
        assert "read-only" in out and "serving" in out
        assert ("WARNING" in err and "127.0.0.1" in err) == warns, err


def test_evo_dashboard_refuses_a_missing_directory(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["dashboard", str(tmp_path / "nope")]) == 2
    assert "neither a runs directory nor a run directory" in capsys.readouterr().err


def test_registering_the_command_stays_light() -> None:
    """`evo` loads dashboards.cli on every command: it must not pull in the run store (torch)."""
    from dashboards.cli import DB_NAME
    from evo.runstore import DB_NAME as STORE_DB_NAME

    assert DB_NAME == STORE_DB_NAME
    code = "import sys, dashboards.cli; print('torch' in sys.modules, 'evo.runstore' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}).stdout.split()
    assert out == ["False", "False"]
