"""The journal side of accounting: runs read back from job rows and events, the compact
``accounting`` table (written, back-filled, and derived on the fly when a row is missing),
and ``trellis-sim whatif`` on a synthetic journal written through the journal's own code."""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path

import pytest

from bench.governance_report import build
from masterd.core.accounting import report, report_jobs
from masterd.journal import accounting, liquid
from masterd.journal.history import read_history
from masterd.journal.store import Store
from shared.model import Job, JobSpec, JobState, NodeAllocation, Placement
from sim import cli as sim_cli


def _spec(tenant: str, gpus: int = 2) -> JobSpec:
    return JobSpec(name="t", command=("true",), user="alice", tenant=tenant, gpus=gpus,
                   cpus=4, memory_mib=1024)


def _placed(gpus: int) -> Placement:
    return Placement((NodeAllocation(node="n1", gpus=tuple(range(gpus)), cpus=(0, 1, 2, 3),
                                     memory_mib=1024),))


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "journal.db")
    liquid.create_tables(s)
    accounting.create_tables(s)
    yield s
    s.close()


def _journal_two_jobs(store: Store) -> None:
    """``once`` ran once (100..400 s, finished); ``twice`` ran 100..200, was requeued after a
    node loss, and ran again 300..700 before failing."""
    once = Job(id="once", spec=_spec("phys"), submit_time=50.0)
    twice = Job(id="twice", spec=_spec("bio", gpus=1), submit_time=60.0)
    store.insert_jobs([(1, once), (2, twice)])
    place = [{"node": "n1", "gpus": [0], "cpus": [0, 1, 2, 3]}]
    once.state, once.placement, once.start_time, once.end_time = (
        JobState.FINISHED, _placed(2), 100.0, 400.0)
    twice.state, twice.placement, twice.start_time, twice.end_time = (
        JobState.FAILED, _placed(1), 300.0, 700.0)
    twice.restarts = 1
    store.update_jobs([once, twice], [
        (99.0, "twice", None, "placed", {"placement": place}),
        (100.0, "twice", None, "running", {}),
        (200.0, "twice", None, "requeued", {"reason": "node lost"}),
        (299.0, "twice", None, "placed", {"placement": place}),
        (300.0, "twice", None, "running", {}),
        (700.0, "twice", None, "failed", {"reason": "exited with code 1"}),
    ])
    liquid.insert_usage(store, [("once", "n1", 400.0, True,
                                 {"seconds": 300.0, "gpu_util_mean": 80.0}, None, None)])


def test_runs_come_from_rows_and_for_reruns_from_events(store: Store) -> None:
    _journal_two_jobs(store)
    jobs = {j.id: j for j in read_history(store.db).jobs}
    once, twice = jobs["once"], jobs["twice"]
    assert [(r.start, r.end, r.gpus, r.cpus) for r in once.runs] == [(100.0, 400.0, 2, 4)]
    assert once.gpu_util == pytest.approx(0.8)
    assert [(r.start, r.end, r.gpus) for r in twice.runs] == [(100.0, 200.0, 1),
                                                              (300.0, 700.0, 1)]
    assert twice.requeued_at == [200.0] and twice.account == "bio"


def test_the_table_gives_what_derivation_gives_and_fills_gaps(store: Store) -> None:
    _journal_two_jobs(store)
    derived = report_jobs(read_history(store.db).jobs, "account", 0.0, 1000.0)
    # Nothing in the table yet: every ended job is derived on the fly.
    assert report_jobs(accounting.read_jobs(store.db), "account", 0.0, 1000.0) == derived
    assert accounting.record_ended(store, ["once"]) == 1
    assert accounting.record_ended(store, ["once"]) == 0  # written once
    # One row from the table, one derived: the same report.
    assert report_jobs(accounting.read_jobs(store.db), "account", 0.0, 1000.0) == derived
    assert accounting.backfill(store, 10) == (1, 2)  # "twice", seq 2
    assert accounting.backfill(store, 10, 2) == (0, None)
    assert accounting.backfill(store, 10) == (0, None)  # nothing missing from the start
    assert report_jobs(accounting.read_jobs(store.db), "account", 0.0, 1000.0) == derived
    # The table complete, facts are read from it as plain tuples: the same report.
    assert report(accounting.read_facts(store.db), "account", 0.0, 1000.0) == derived
    assert report(accounting.read_facts(store.db, users=["bob"]), "user", 0.0, 1000.0) == []
    rows = {r["account"]: r for r in derived}
    assert rows["bio"]["gpu_hours_allocated"] == pytest.approx(500 / 3600, abs=1e-6)
    assert rows["bio"]["requeues"] == 1 and rows["bio"]["jobs"]["failed"] == 1
    assert rows["phys"]["gpu_hours_busy"] == pytest.approx(0.8 * 600 / 3600, abs=1e-6)
    # A window that ended before "twice" ended leaves its end out.
    early = {r["account"]: r for r in report_jobs(accounting.read_jobs(store.db, ended_since=0.0),
                                             "account", 0.0, 250.0)}
    assert early["bio"]["jobs"]["failed"] == 0 and early["bio"]["requeues"] == 1


def test_a_journal_without_the_table_is_still_reported(tmp_path: Path) -> None:
    s = Store(tmp_path / "old.db")
    try:
        _journal_two_jobs_no_usage(s)
        db = sqlite3.connect(f"file:{tmp_path / 'old.db'}?mode=ro", uri=True)
        rows = {r["account"] for r in report_jobs(accounting.read_jobs(db), "account", 0, 1000)}
        db.close()
        assert rows == {"phys", "bio"}
    finally:
        s.close()


def _journal_two_jobs_no_usage(store: Store) -> None:
    once = Job(id="a", spec=_spec("phys"), submit_time=1.0)
    other = Job(id="b", spec=_spec("bio"), submit_time=2.0)
    store.insert_jobs([(1, once), (2, other)])
    for job in (once, other):
        job.state, job.placement, job.start_time, job.end_time = (
            JobState.FINISHED, _placed(2), 10.0, 20.0)
    store.update_jobs([once, other], [])


def test_the_databases_sums_equal_the_cores_aggregation(tmp_path: Path) -> None:
    """report_journal (SQL sums for jobs that ran once) gives exactly the core's report."""
    store = Store(tmp_path / "journal.db")
    try:
        build(store, days=2, per_day=150, rng=random.Random(3))
        jobs = read_history(store.db).jobs
        first = min(j.submit for j in jobs)
        for by in ("account", "user", "gpu-model"):
            for since, until in ((first - 10, first + 3 * 86400), (first + 3600, first + 40_000),
                                 (first + 86400, first + 86400 + 600)):
                expected = report_jobs(jobs, by, since, until)
                got = accounting.report_journal(store.db, by, since, until)
                assert _close(got, expected), (by, since, until)
        user = jobs[0].user
        assert _close(accounting.report_journal(store.db, "user", first - 10, first + 3 * 86400,
                                                [user]),
                      report_jobs([j for j in jobs if j.user == user], "user", first - 10,
                                  first + 3 * 86400))
    finally:
        store.close()


def _close(got: list[dict], expected: list[dict]) -> bool:  # type: ignore[type-arg]
    """Equal rows, GPU-hours up to float summation order."""
    if [r.get("account", r.get("user", r.get("gpu_model"))) for r in got] != \
            [r.get("account", r.get("user", r.get("gpu_model"))) for r in expected]:
        return False
    for a, b in zip(got, expected, strict=True):
        for key, value in b.items():
            if isinstance(value, float):
                if a[key] is None or abs(a[key] - value) > 1e-5:
                    return False
            elif a[key] != value:
                return False
    return True


def test_whatif_on_a_synthetic_journal(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                       ) -> None:
    store = Store(tmp_path / "journal.db")
    try:
        jobs, _ = build(store, days=1, per_day=120, rng=random.Random(7))
    finally:
        store.close()
    out = tmp_path / "w.json"
    code = sim_cli.main(["whatif", "--journal", str(tmp_path / "journal.db"),
                         "--policies", "fifo,sjf", "--json", str(out),
                         "--plots", str(tmp_path / "plots")])
    text = capsys.readouterr().out
    assert code == 0, text
    pytest.importorskip("matplotlib")
    assert {p.name for p in (tmp_path / "plots").iterdir()} == {"whatif_summary.png",
                                                                "whatif_shares.png"}
    assert "actual" in text and "share acct" in text
    runs = json.loads(out.read_text())["runs"]
    assert [r["name"] for r in runs] == ["actual", "fifo", "sjf"]
    assert all(r["jobs"] == jobs for r in runs)
    # Every job's run time is replayed as measured: the GPU-hours per account match.
    for account, share in runs[0]["shares"].items():
        assert runs[1]["shares"][account] == pytest.approx(share, abs=0.02)
    # --since after the last submission: nothing to replay, one sentence.
    code = sim_cli.main(["whatif", "--journal", str(tmp_path / "journal.db"),
                         "--since", "2100-01-01"])
    assert code == 2 and "nothing to replay" in capsys.readouterr().err


def test_whatif_replays_the_journalled_account_tree(tmp_path: Path) -> None:
    """The replay admits jobs under the tree the journal holds: with every account capped
    at one running job, jobs of an account wait for each other (without, the replay finds
    the cluster nearly empty)."""
    from masterd.core.policies import make_policy
    from masterd.journal.accounts import create_tables, write_tree
    from shared.accounts import Account, AccountCaps
    from sim.whatif import load_journal, replay

    store = Store(tmp_path / "journal.db")
    try:
        build(store, days=1, per_day=120, rng=random.Random(7))
        before = replay(load_journal(str(tmp_path / "journal.db")), [("fifo", make_policy("fifo"))])
        create_tables(store)
        tree = [Account(name=f"acct{i:02d}", caps=AccountCaps(running_jobs=1))
                for i in range(20)]
        write_tree(store, tree, 0.0, None)
    finally:
        store.close()
    data = load_journal(str(tmp_path / "journal.db"))
    assert list(data.accounts) == tree
    after = replay(data, [("fifo", make_policy("fifo"))], fairshare=True)
    assert after[1].wait_mean_s > before[1].wait_mean_s
    assert after[1].jobs == before[1].jobs


def test_report_and_whatif_on_either_store(store_factory) -> None:  # type: ignore[no-untyped-def]
    """The same journal code on SQLite and PostgreSQL: the database's sums equal the core's
    aggregation, and whatif reads the journal by its location (path or URL)."""
    from masterd.journal.backends import open_reader
    from sim.whatif import load_journal

    store = store_factory()
    try:
        liquid.create_tables(store)
        accounting.create_tables(store)
        count, _ = build(store, days=1, per_day=60, rng=random.Random(5))
        location = store.location
    finally:
        store.close()
    db = open_reader(location)
    try:
        jobs = read_history(db).jobs
        first = min(j.submit for j in jobs)
        window = (first - 1, first + 2 * 86400)
        assert any(j.gpu_util is not None for j in jobs)
        for by in ("account", "gpu-model"):
            assert _close(accounting.report_journal(db, by, *window),
                          report_jobs(jobs, by, *window))
    finally:
        db.close()
    data = load_journal(location)
    assert len(data.workload.jobs) == count


def test_a_usage_report_after_the_row_fills_its_utilisation(store: Store) -> None:
    _journal_two_jobs_no_usage(store)
    assert accounting.record_ended(store, ["a", "b"]) == 2
    window = (0.0, 100.0)
    assert accounting.report_journal(store.db, "account", *window)[0]["gpu_hours_busy"] is None
    liquid.insert_usage(store, [("a", "n1", 20.0, True, {"seconds": 10.0, "gpu_util_mean": 50.0},
                                 None, None)])
    accounting.refresh_utilisation(store, "a")
    accounting.refresh_utilisation(store, "nobody")  # no row, no report: nothing happens
    rows = {r["account"]: r for r in accounting.report_journal(store.db, "account", *window)}
    assert rows["phys"]["gpu_hours_busy"] == pytest.approx(0.5 * 20 / 3600, abs=1e-6)
    assert rows["bio"]["gpu_hours_busy"] is None
