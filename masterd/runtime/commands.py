"""What a command to a node raises when it does not succeed: features catch it (they speak to
nodes through ``FeatureContext.nodes.send``) without depending on the service layer that sends
it (masterd.service.sessions)."""

from __future__ import annotations


class CommandFailed(RuntimeError):
    """A node refused a command, did not answer in time, or went away."""

    def __init__(self, node: str, command: str, code: str, message: str,
                 unknown_outcome: bool = False) -> None:
        super().__init__(f"node {node}: {command} failed ({code}): {message}")
        self.code = code
        self.message = message
        # The command was sent and no answer came (a timeout, the connection lost while
        # waiting): the node may have carried it out. False: it surely did not (refused by
        # the node, or never sent).
        self.unknown_outcome = unknown_outcome
