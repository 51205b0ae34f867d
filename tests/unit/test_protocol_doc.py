"""docs/protocol.md is what the code serves: regenerated here and compared."""

from __future__ import annotations

from masterd.api.protocol_doc import COMMAND, OUTPUT, method_table, render, undocumented


def test_every_method_documents_its_result() -> None:
    methods = method_table()
    assert {"submit", "submit_many", "jobs", "place"} <= set(methods)
    missing = undocumented(methods)
    assert not missing, (f"RPC methods without @returns(...) (shared.rpcdoc) next to their "
                         f"handler: {missing}")


def test_protocol_reference_is_current() -> None:
    text = render()
    assert "### submit_many" in text and "## Job spec" in text and "#### hello" in text
    current = OUTPUT.read_text() if OUTPUT.exists() else ""
    assert current == text, f"{OUTPUT} is out of date: run `{COMMAND}` and commit it"
