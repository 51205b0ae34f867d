"""The fair-share feature on its own: a client's ``share`` shows its own accounts' subtree,
an admin's every account; a swapped tree applies at once; bad report windows are refused."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from masterd.api.fairshare import ReportParams, ShareParams, method_table
from masterd.features.fairshare import FairShareFeature
from masterd.runtime.caller import CALLER
from shared.accounts import Account, AccountTree
from shared.auth import Principal
from shared.model import Job, JobSpec
from shared.protocol import ProtocolError
from tests.unit.feature_context import FeatureHarness

TREE = (Account(name="physics", shares=3), Account(name="bio"),
        Account(name="hep", parent="physics", users=("ann",)),
        Account(name="astro", parent="physics", users=("bea",)),
        Account(name="lab", parent="bio", users=("cy",)))


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[FeatureHarness]:
    harness = FeatureHarness(tmp_path)
    harness.config = replace(harness.config, accounts=TREE)
    try:
        yield harness
    finally:
        await harness.close()


def _job(job_id: str, user: str, account: str) -> Job:
    return Job(id=job_id, spec=JobSpec(name=job_id, command=("true",), user=user,
                                       tenant=account, gpus=1), submit_time=1.0)


async def test_a_client_sees_its_own_subtree_and_an_admin_everything(h: FeatureHarness) -> None:
    feature = FairShareFeature(h.ctx)
    h.events.restored.emit()
    feature.tracker.charge("hep", 4, 0, 0, 0.0, 900.0)
    methods = method_table(feature)
    share = methods["share"][1]
    admin = await share(ShareParams())
    assert [r["account"] for r in admin["accounts"]] == ["bio", "lab", "physics", "astro", "hep"]
    token = CALLER.set(Principal("client", "ann", "token"))
    try:
        mine = await share(ShareParams())
    finally:
        CALLER.reset(token)
    assert [r["account"] for r in mine["accounts"]] == ["hep"]
    # Admitted to a group, a user sees the group's sub-accounts too (the tree comes from the
    # accounts feature, which journals it: accounts_changed).
    h.events.accounts_changed.emit(AccountTree.of((replace(TREE[0], users=("ann",)), TREE[1],
                                                   replace(TREE[2], users=()),
                                                   replace(TREE[3], users=()), TREE[4])))
    assert feature.visible_accounts("ann") == {"physics", "hep", "astro"}
    # Swapping the tree at run time (an admin's change): usage stays with its account.
    feature.set_tree(AccountTree.of([Account(name="hep", shares=1),
                                     Account(name="lab", shares=3)]))
    rows = {r.account: r for r in feature.rows()}
    assert rows["hep"].norm_shares == pytest.approx(0.25) and rows["hep"].raw_usage > 0
    # Without accounts, a client sees the tenants of its own jobs.
    feature.set_tree(AccountTree.of(()))
    h.core.submit(_job("a", "cy", "lab"))
    assert feature.visible_accounts("cy") == {"lab"}


async def test_report_refuses_a_window_that_ends_before_it_starts(h: FeatureHarness) -> None:
    feature = FairShareFeature(h.ctx)
    report = method_table(feature)["report"][1]
    with pytest.raises(ProtocolError, match="must be after since"):
        await report(ReportParams(since=2000.0, until=1000.0))
    result = await report(ReportParams(since=0.0, until=2000.0))
    assert result["rows"] == [] and result["by"] == "account"
