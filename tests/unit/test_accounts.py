"""The account tree: validation of the whole tree, lineage, and which account a job runs under."""

from __future__ import annotations

import pytest

from shared.accounts import Account, AccountError, AccountTree
from shared.config import ConfigError, MasterConfig, load_config
from shared.schema import SchemaError, decode


def tree() -> AccountTree:
    return AccountTree.of([
        Account("org"),
        Account("vision", parent="org", users=("alice", "bob"), default_for=("alice",)),
        Account("nlp", parent="org", users=("bob", "carol"), default_for=("bob",)),
        Account("vision-3d", parent="vision", users=("alice",)),
    ])


def test_lineage_subtree_and_membership() -> None:
    t = tree()
    assert t.enabled and t.roots() == ("org",)
    assert t.lineage("vision-3d") == ("vision-3d", "vision", "org")
    assert t.subtree("org") == ("org", "nlp", "vision", "vision-3d")
    assert t.accounts_of("bob") == {"vision", "nlp"}
    assert t.default_account("carol") == "nlp"  # her only account
    assert t.default_account("alice") == "vision"


def test_account_for_a_job() -> None:
    t = tree()
    assert t.account_for("bob", None) == "nlp"
    assert t.account_for("bob", "vision") == "vision"
    with pytest.raises(AccountError, match="user 'carol' is not in account 'vision'"):
        t.account_for("carol", "vision")
    with pytest.raises(AccountError, match="no account named 'physics'"):
        t.account_for("carol", "physics")
    with pytest.raises(AccountError, match="user 'dave' is in no account"):
        t.account_for("dave", None)


@pytest.mark.parametrize(("accounts", "message"), [
    ([Account("a", parent="b"), Account("b", parent="a")], "cycle: a -> b -> a"),
    ([Account("a", parent="ghost")], "unknown parent 'ghost'"),
    ([Account("a"), Account("a")], "defined twice"),
    ([Account("a", users=("x",)), Account("b", users=("x",))], "none is marked default_for"),
    ([Account("a", users=("x",), default_for=("x",)),
      Account("b", users=("x",), default_for=("x",))], "two default accounts"),
    ([Account("a", default_for=("x",))], "not among its users"),
])
def test_a_tree_that_cannot_hold_is_refused_whole(accounts: list[Account], message: str) -> None:
    with pytest.raises(AccountError, match=message):
        AccountTree.of(accounts)


def test_changes_are_all_or_nothing() -> None:
    t = tree()
    with pytest.raises(AccountError, match="cycle"):
        t.replaced(Account("org", parent="vision-3d"))
    assert t["org"].parent is None  # unchanged
    with pytest.raises(AccountError, match="has sub-accounts"):
        t.without("vision")
    assert "vision-3d" not in t.without("vision-3d")


def test_absurd_values_are_refused_by_the_schema() -> None:
    with pytest.raises(SchemaError, match=r"caps\.running_jobs"):
        decode(Account, {"name": "a", "caps": {"running_jobs": -1}})
    with pytest.raises(SchemaError, match=r"quota\.gpus"):
        decode(Account, {"name": "a", "quota": {"gpus": 10**9}})


def test_master_configuration_refuses_a_broken_tree(tmp_path) -> None:
    path = tmp_path / "master.toml"
    path.write_text('[master]\n[[master.accounts]]\nname = "a"\nparent = "nobody"\n')
    with pytest.raises(ConfigError, match="unknown parent 'nobody'"):
        load_config(MasterConfig, path, "master")
    path.write_text('[master]\n[[master.accounts]]\nname = "a"\nusers = ["u"]\n'
                    'quota = { gpus = 4 }\n')
    cfg = load_config(MasterConfig, path, "master")
    assert cfg.accounts[0].quota.gpus == 4 and cfg.accounts[0].users == ("u",)
