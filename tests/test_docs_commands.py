"""Every `sinklab ...` command quoted in README.md, docs/ and configs/ parses: its subcommand exists, each flag
is one that subcommand's parser takes (exactly, not as an abbreviation), and it gives no more positional
arguments than the parser has. Nothing is run: each command's own parser is caught as it starts to parse."""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
from pathlib import Path
from unittest import mock

import pytest

from pipeline.cli import SUBCOMMANDS

REPO = Path(__file__).resolve().parents[1]
QUOTED_IN = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "configs").rglob("*.yaml"))]
INLINE = re.compile(r"`(sinklab [^`]+)`")
# a quoted message (`sinklab fit: ...`) or an output marker's writer (`sinklab analyze of <model>`), not a command
NOT_A_COMMAND = re.compile(r"^sinklab (\S+:|<\w+>|\S+ of )")
ELIDED = {"...", "|"}  # "the rest as before" and "one of these", in usage lines


def quoted_commands(path: Path) -> list[tuple[int, str]]:
    """(line number, command) of each `sinklab ...` in ``path``: whole lines of its code blocks (YAML: of its
    comments), continued over trailing backslashes, and inline code spans."""
    lines = path.read_text(encoding="utf-8").splitlines()
    yaml = path.suffix == ".yaml"
    found, fenced, number = [], False, 0
    while number < len(lines):
        line = lines[number]
        if not yaml and line.lstrip().startswith("```"):
            fenced, number = not fenced, number + 1
            continue
        text = line.partition("#")[2] if yaml else line
        start = re.sub(r"^\$\s+|^(\w+=\S+\s+)+", "", text.strip())
        if (fenced or yaml) and start.startswith("sinklab "):
            command, first = start, number
            while command.endswith("\\") and number + 1 < len(lines):
                number += 1
                command = command[:-1] + " " + (lines[number].partition("#")[2] if yaml else lines[number]).strip()
            found.append((first + 1, command))
        elif not fenced:
            found += [(number + 1, span) for span in INLINE.findall(text)]
        number += 1
    return [(n, c) for n, c in found if not NOT_A_COMMAND.match(c)]


def words(command: str) -> list[list[str]]:
    """Each `sinklab` command of a line (split at && and ;) as words, comments and usage brackets dropped."""
    tokens = shlex.split(command, comments=True)
    commands, current = [], []
    for token in tokens:
        if token in ("&&", ";"):
            commands, current = commands + [current], []
            continue
        token = token.strip("[]")
        if re.fullmatch(r"(--?[\w.-]+/)+--?[\w.-]+", token):  # --bos/--no-bos: both spellings
            current += token.split("/")
        elif token and token not in ELIDED:
            current.append(token)
    return [c[1:] for c in commands + [current] if c and c[0] == "sinklab"]


class _Parsing(Exception):
    def __init__(self, parser: argparse.ArgumentParser, args):
        super().__init__()
        self.parser, self.args = parser, list(args)


def argparse_parser(name: str, argv: list[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    """The parser ``sinklab NAME ARGV`` parses with, and what it is given (prep's and sweep's mains pick a parser
    or cut the argv first), caught before anything is parsed or run."""

    def caught(self, args=None, namespace=None):
        raise _Parsing(self, args)

    module = importlib.import_module(SUBCOMMANDS[name][0])
    with mock.patch.object(argparse.ArgumentParser, "parse_known_args", caught):
        try:
            module.main(argv)
        except _Parsing as parsing:
            return parsing.parser, parsing.args
    raise AssertionError(f"sinklab {name} returned without parsing its arguments")


def argparse_problems(parser: argparse.ArgumentParser, args: list[str]) -> list[str]:
    options, positionals, at = parser._option_string_actions, [], 0
    while at < len(args):
        word, at = args[at], at + 1
        if word == "--":
            break
        if not word.startswith("-") or re.fullmatch(r"-\d.*", word):
            positionals.append(word)
            continue
        action = options.get(word.split("=")[0])
        if action is None:
            return [f"{word.split('=')[0]} is not an option of {parser.prog}"]
        takes = {None: 1, "?": 1, "*": len(args), "+": len(args)}.get(action.nargs, action.nargs)
        for _ in range(0 if "=" in word else takes):
            if at < len(args) and not args[at].startswith("--"):
                at += 1
    room = sum(
        {None: 1, "?": 1}.get(a.nargs, a.nargs if isinstance(a.nargs, int) else 10**6)
        for a in parser._actions
        if not a.option_strings
    )
    return [f"{parser.prog} takes {room} positional arguments, given {positionals}"] if len(positionals) > room else []


@pytest.fixture(scope="module")
def fit_options() -> dict:
    from pipeline.train.fit_config import CHECK_ONLY, fit_parser

    parser = fit_parser()
    return {**parser._option_string_actions, CHECK_ONLY: None}


def fit_problems(options: dict, args: list[str]) -> list[str]:
    """Flags `sinklab fit` does not take; a key below a class-typed option (--trainer.strategy.config) is that
    class's, known only once the class is."""
    problems = []
    for word in (w.split("=")[0] for w in args if w.startswith("--") and w != "--"):
        parents = [".".join(word.split(".")[:n]) for n in range(1, word.count(".") + 1)]
        if word not in options and not any(type(options.get(p)).__name__ == "ActionTypeHint" for p in parents):
            problems.append(f"{word} is not an option of sinklab fit")
    return problems


def test_the_docs_quote_commands():
    counted = sum(len(quoted_commands(path)) for path in QUOTED_IN)
    assert counted > 200  # the extraction finds them: a change of format would otherwise pass unseen


def test_every_quoted_command_parses(fit_options):
    problems = []
    for path in QUOTED_IN:
        for number, line in quoted_commands(path):
            for argv in words(line):
                where = f"{path.relative_to(REPO)}:{number}: `{line}`"
                name, args = argv[0], argv[1:]
                if name not in SUBCOMMANDS:
                    problems.append(f"{where}: no subcommand {name!r}")
                    continue
                fit_args = args[args.index("--") + 1 :] if "--" in args and name in ("sweep", "submit") else []
                if name == "fit":
                    said = fit_problems(fit_options, args)
                else:
                    said = argparse_problems(*argparse_parser(name, args)) + fit_problems(fit_options, fit_args)
                problems += [f"{where}: {problem}" for problem in said]
    assert not problems, "\n".join(problems)
