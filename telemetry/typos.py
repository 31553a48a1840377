"""Typos answered with the nearest valid name: a flag, a subcommand, a config or hostfile key.

`fleet train --updtes 10` used to print 41 lines of usage before the error, and no hint. The
`Parser` here prints one short usage line, the error, and the nearest valid name
(difflib.get_close_matches, as Python 3.14's argparse does with `suggest_on_error`).
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Iterable
from typing import NoReturn


def nearest(word: str, known: Iterable[str]) -> str | None:
    """The known name closest to `word`, or None when none is close."""
    found = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return found[0] if found else None


def did_you_mean(word: str, known: Iterable[str], quote: bool = False) -> str:
    """ " (did you mean --updates?)", or "" when no known name is close."""
    best = nearest(word, known)
    if best is None:
        return ""
    return f" (did you mean {best!r}?)" if quote else f" (did you mean {best}?)"


_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)")


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are three short lines: the usage in one line, the error
    with the nearest valid name, and where the full help is. Its subparsers are Parsers too."""

    def error(self, message: str) -> NoReturn:
        self.exit(
            2,
            f"{self.short_usage()}\n{self.prog}: error: {self.explain(message)}\n"
            f"('{self.prog} --help' lists every option)\n",
        )

    def short_usage(self) -> str:
        """`usage: fleet train [options]`: the positionals by name, the options not listed."""
        words = [self.prog, "[options]"]
        for a in self._actions:
            if a.option_strings or a.help == argparse.SUPPRESS:
                continue
            if isinstance(a, argparse._SubParsersAction):
                name = a.metavar or "{" + ",".join(a.choices) + "}"
            else:
                name = a.metavar if isinstance(a.metavar, str) else a.dest.upper()
            many = a.nargs in ("+", "*", argparse.REMAINDER)
            words.append(f"[{name} ...]" if a.nargs in ("?", "*") else name + (" ..." * many))
        return "usage: " + " ".join(words)

    def explain(self, message: str) -> str:
        """argparse's message, with the nearest valid name of what was mistyped."""
        if message.startswith("unrecognized arguments: "):
            words = message.removeprefix("unrecognized arguments: ").split()
            flags = [w.split("=")[0] for w in words if w.startswith("-")]
            if flags:  # the words after a mistyped flag are its value: not worth a mention
                known = self.option_names()
                return "; ".join(f"unknown option {f}{self._hint(f, known)}" for f in flags)
            return message
        m = _INVALID_CHOICE.search(message)
        if m:
            hidden = ("_",)  # internal subcommands (bench's _worker) are not offered
            choices = [c for c in re.findall(r"'([^']*)'", m.group(2)) if not c.startswith(hidden)]
            hint = did_you_mean(m.group(1), choices, quote=True)
            return message.split(": invalid choice")[0] + (
                f": {m.group(1)!r} is not one of {', '.join(choices)}{hint}"
            )
        return message

    @staticmethod
    def _hint(flag: str, known: set[str]) -> str:
        # A parent parser hears its subcommand's unknown flags and knows every subcommand's:
        # a flag that another subcommand takes is not a typo to correct into itself.
        if flag in known:
            return " (another subcommand takes it, not this one)"
        return did_you_mean(flag, known)

    def option_names(self) -> set[str]:
        """Every option string of this parser and of its subcommands' parsers."""
        names: set[str] = set()
        for a in self._actions:
            names.update(a.option_strings)
            if isinstance(a, argparse._SubParsersAction):
                for sub in a.choices.values():
                    if isinstance(sub, Parser):
                        names |= sub.option_names()
        return names
