"""Write man pages (roff, man macros) for the three programs from their argparse parsers.

    python packaging/manpage.py OUTDIR        # writes trellisctl.1, trellis-masterd.8, ...

The options and commands come from the very parsers the programs use, so the pages never
drift from ``--help``. Sections a parser cannot know (files, signals, exit status) are added
here per program.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Appended, not prepended: an installed copy (the package build runs this with the packaged
# interpreter) wins over the source tree.
sys.path.append(str(ROOT))


@dataclass(frozen=True)
class Page:
    prog: str
    section: int
    summary: str
    parser: Callable[[], argparse.ArgumentParser]
    extra: dict[str, str] = field(default_factory=dict)  # SECTION NAME -> roff body


def roff(text: str) -> str:
    """Escape plain text for roff: backslashes, and a leading dot or quote on any line."""
    out = []
    for line in text.replace("\\", "\\e").splitlines():
        out.append("\\&" + line if line.startswith((".", "'")) else line)
    return "\n".join(out)


def _opt(s: str) -> str:
    return s.replace("-", "\\-")


def _metavar(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.choices:
        return "{" + ",".join(str(c) for c in action.choices) + "}"
    return action.metavar or action.dest.upper()


def _options(parser: argparse.ArgumentParser) -> list[str]:
    lines: list[str] = []
    for action in parser._actions:  # argparse has no public API to walk its arguments
        if isinstance(action, argparse._SubParsersAction) or action.help == argparse.SUPPRESS:
            continue
        meta = _metavar(action)
        if action.option_strings:
            names = ", ".join(f"\\fB{_opt(o)}\\fR" + (f" \\fI{roff(meta)}\\fR" if meta else "")
                              for o in action.option_strings)
        else:
            names = f"\\fI{roff(meta or action.dest)}\\fR"
        lines += [".TP", names, roff(action.help or "")]
    return lines


def _commands(parser: argparse.ArgumentParser) -> list[str]:
    lines: list[str] = []
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {a.dest: a.help or "" for a in action._choices_actions}
        for name, sub in action.choices.items():
            usage = sub.format_usage().replace("usage: ", "").strip()
            lines += [".SS " + roff(name), roff(helps.get(name, "")), ".PP",
                      f"\\fB{roff(' '.join(usage.split()))}\\fR"]
            opts = [o for o in _options(sub)]
            if opts:
                lines += [".RS", *opts, ".RE"]
    return lines


def render(page: Page, date: str) -> str:
    parser = page.parser()
    usage = " ".join(parser.format_usage().replace("usage: ", "").split())
    lines = [
        f'.TH {page.prog.upper()} {page.section} "{date}" "Trellis" "Trellis manual"',
        ".SH NAME",
        f"{page.prog} \\- {roff(page.summary)}",
        ".SH SYNOPSIS",
        f"\\fB{roff(usage)}\\fR",
        ".SH DESCRIPTION",
        roff(parser.description or ""),
        ".SH OPTIONS",
        *_options(parser),
    ]
    commands = _commands(parser)
    if commands:
        lines += [".SH COMMANDS", *commands]
    if parser.epilog:
        lines += [".SH NOTES", roff(parser.epilog)]
    for title, body in page.extra.items():
        lines += [f".SH {title}", body]
    lines += [".SH SEE ALSO",
              ", ".join(f"\\fB{p.prog}\\fR({p.section})" for p in PAGES if p is not page)
              + ", \\fBsystemctl\\fR(1), \\fBjournalctl\\fR(1)"]
    return "\n".join(lines) + "\n"


def _masterd() -> argparse.ArgumentParser:
    from masterd.main import build_parser

    return build_parser()


def _noded() -> argparse.ArgumentParser:
    from noded.main import build_parser

    return build_parser()


def _ctl() -> argparse.ArgumentParser:
    from control.cli import build_parser

    return build_parser()


PAGES = [
    Page("trellisctl", 1, "administer a Trellis GPU cluster", _ctl, {
        "EXIT STATUS": ".TP\n0\nsuccess\n.TP\n1\nthe master refused the request\n.TP\n2\n"
                       "bad usage or input\n.TP\n3\nthe master could not be reached, or is "
                       "shutting down\n.TP\n130\ninterrupted",
        "ENVIRONMENT": ".TP\n\\fBTRELLIS_MASTER\\fR\nmaster URL when \\fB\\-\\-master\\fR "
                       "is not given",
        "FILES": ".TP\n~/.config/trellis/trellisctl.toml, /etc/trellis/trellisctl.toml\n"
                 "\\fBmaster = \"URL\"\\fR: the master to use",
    }),
    Page("trellis-masterd", 8, "Trellis master: scheduler, journal and admin RPC", _masterd, {
        "SIGNALS": ".TP\nSIGHUP\nre-read the configuration; apply the keys that can change at "
                   "run time, log each change, refuse an invalid file and keep running\n.TP\n"
                   "SIGTERM, SIGINT\ndrain: refuse new requests (503), let those in flight "
                   "finish, close the journal, exit",
        "FILES": ".TP\n/etc/trellis/masterd.toml\nconfiguration\n.TP\n"
                 "/var/lib/trellis/master/master.db\nthe journal (SQLite, WAL)",
    }),
    Page("trellis-noded", 8, "Trellis node daemon: runs and confines jobs on a GPU server",
         _noded, {
             "SIGNALS": ".TP\nSIGHUP\nre-read the configuration; apply the keys that can "
                        "change at run time\n.TP\nSIGTERM, SIGINT\nstop the daemon; jobs keep "
                        "running under their shims and are re-adopted by the next start",
             "FILES": ".TP\n/etc/trellis/noded.toml\nconfiguration\n.TP\n"
                      "/var/lib/trellis/node/jobs/JOB/\nper-job state and output.log",
         }),
]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: manpage.py OUTDIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    date = datetime.date.today().isoformat()
    for page in PAGES:
        path = out / f"{page.prog}.{page.section}"
        path.write_text(render(page, date))
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
