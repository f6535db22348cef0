"""The documentation's commands agree with the code: every `python -m sglang.launch_server`, `python -m
sglang_pdd.router` / `sglang-pdd-router` and `python -m sglang.bench_serving` command line in a fenced
block of README.md, docs/*.md and examples/**/*.md parses with sglang 0.5.23's parser plus the plugin's
`--pdd-*` flags, the router's `build_parser()` (read at run time: flags added since are known), or
bench_serving's own flags; a RelayDecode or MainDecode command streams incrementally; and every flag the
README names anywhere, prose included, is one of those parsers', a lab tool's or pip's.

The example scripts and manifests are parsed on their dry runs and renderings by their own tests
(test_two_site_gpu.py, test_cpu_two_dc.py, test_kubernetes.py)."""

from __future__ import annotations

import argparse
import copy
import glob
import importlib.util
import os
import re
import shlex

import pytest

from sglang_pdd import config

from .conftest import EXAMPLES, REPO

DOCS = [os.path.join(REPO, "README.md"), *sorted(glob.glob(os.path.join(REPO, "docs", "*.md"))),
        *sorted(glob.glob(os.path.join(EXAMPLES, "**", "*.md"), recursive=True))]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
OTHER_TOOLS = {"--help", "--no-deps"}  # pip's, every tool's


ASSIGN = re.compile(r"^[A-Z_][A-Z0-9_]*=")


def commands_with_env(path: str) -> list[tuple[str, list[str], dict[str, str]]]:
    """(what, argv after the command, the environment the block gives it: `export VAR=value` lines before
    it and `VAR=value` words in front of it) of every command line in the file's fenced blocks; `...` and
    `[optional]` placeholders dropped, continuation lines joined, comments cut."""
    with open(path) as f:
        text = f.read()
    out = []
    for block in FENCE.findall(text):
        exported: dict[str, str] = {}
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            try:
                words = shlex.split(line, comments=True)
            except ValueError:
                continue
            words = [w for w in words if w != "..."]
            if words[:1] == ["export"]:
                exported.update(w.split("=", 1) for w in words[1:] if ASSIGN.match(w))
                continue
            env = dict(exported)
            for i, w in enumerate(words):
                if ASSIGN.match(w) and all(ASSIGN.match(x) for x in words[:i]):
                    env.update([w.split("=", 1)])
                if w == "-m" and i + 1 < len(words) and words[i + 1] in (
                        "sglang.launch_server", "sglang_pdd.router", "sglang.bench_serving"):
                    out.append((words[i + 1], words[i + 2:], env))
                    break
                if os.path.basename(w) == "sglang-pdd-router":
                    out.append(("sglang_pdd.router", words[i + 1:], env))
                    break
    return out


def commands(path: str) -> list[tuple[str, list[str]]]:
    """(what, argv after the command) of every command line in the file's fenced blocks."""
    return [(what, argv) for what, argv, _ in commands_with_env(path)]


def all_commands() -> list[tuple[str, str, list[str]]]:
    return [(os.path.relpath(p, REPO), what, argv) for p in DOCS for what, argv in commands(p)]


def router_parser() -> argparse.ArgumentParser:
    """The router's parser, with nothing required (a doc snippet may leave the peers out) and raising."""
    from sglang_pdd.router.__main__ import build_parser

    p = copy.deepcopy(build_parser())
    for a in p._actions:
        a.required = False
    p.exit_on_error = False
    p.allow_abbrev = False
    return p


def bench_serving_flags() -> set[str]:
    """bench_serving's flags, from its source (its parser is built inside cli_main)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None:
        pytest.skip("sglang not installed")
    with open(os.path.join(os.path.dirname(spec.origin), "benchmark", "serving.py")) as f:
        return set(re.findall(r'add_argument\(\s*"(--[a-z0-9-]+)"', f.read()))


def lab_flags() -> set[str]:
    out = set()
    for path in glob.glob(os.path.join(REPO, "sglang_pdd", "lab", "**", "*.py"), recursive=True):
        with open(path) as f:
            out |= set(re.findall(r'add_argument\(\s*"(--[a-z0-9-]+)"', f.read()))
    return out


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings}


def test_the_docs_have_the_commands_this_checks():
    found = {(path, what) for path, what, _ in all_commands()}
    for must in (("README.md", "sglang.launch_server"), ("README.md", "sglang_pdd.router"),
                 ("README.md", "sglang.bench_serving"), ("docs/bench.md", "sglang.bench_serving")):
        assert must in found, must
    roles = {argv[argv.index("--pdd-role") + 1] for _, what, argv in all_commands()
             if what == "sglang.launch_server" and "--pdd-role" in argv}
    assert roles == {"prefill", "relay", "main"}


def test_every_server_command_parses_and_decode_roles_stream_incrementally(server_parser, tmp_path):
    """Each starts, as far as the plugin's start-up checks go, with the keys its block gives it (the files
    `protocol.keygen` writes, by name): a relay other hosts reach without its CURVE keys would not."""
    from sglang_pdd.protocol import keygen

    from .server_argv import role_environment

    keygen.write(str(tmp_path), ["main"])
    n = 0
    for path in DOCS:
        for what, argv, env in commands_with_env(path):
            if what != "sglang.launch_server":
                continue
            path = os.path.relpath(path, REPO)
            try:
                ns = server_parser.parse_args(argv)
            except (argparse.ArgumentError, SystemExit) as e:  # an unknown flag exits even so
                pytest.fail(f"{path}: {shlex.join(argv)}: {e}")
            keys = {k: str(tmp_path / os.path.basename(v)) for k, v in env.items() if k.startswith("SGLANG_PDD_")}
            if "SGLANG_PDD_SECRET_FILE" not in keys:  # a block that names no secret: the reader's own exported one
                keys["SGLANG_PDD_SECRET"] = "a-secret-of-16-bytes-or-more"
            if "--config" in argv:  # sglang's config file: one keygen wrote, by its name
                assert os.path.basename(argv[argv.index("--config") + 1]) in keygen.files(["main"]), path
            with role_environment(keys):
                try:
                    cfg = config.from_cli_args(ns, ns.disaggregation_mode, ns.disaggregation_decode_enable_radix_cache)
                except config.PddConfigError as e:
                    pytest.fail(f"{path}: {shlex.join(argv)} would not start: {e}")
            n += 1
            if cfg.role is not None and (cfg.role.value in ("relay", "main") or cfg.relays_locally):
                # a stream the router reads token by token: each chunk its new tokens, not all of them again
                assert ns.incremental_streaming_output, f"{path}: {cfg.role.value} without --incremental-streaming-output"
    assert n >= 3
    # the control: the README's relay without the CURVE keys its line gives it would not start
    (argv,) = [a for w, a, _ in commands_with_env(DOCS[0]) if w == "sglang.launch_server"
               and "--pdd-role" in a and a[a.index("--pdd-role") + 1] == "relay"]
    ns = server_parser.parse_args(argv)
    with role_environment({"SGLANG_PDD_SECRET": "a-secret-of-16-bytes-or-more"}):
        with pytest.raises(config.PddConfigError, match="--pdd-token-curve on: no key"):
            config.from_cli_args(ns, ns.disaggregation_mode, ns.disaggregation_decode_enable_radix_cache)


def test_every_router_command_parses():
    parser = router_parser()
    n = 0
    for path, what, argv in all_commands():
        if what != "sglang_pdd.router" or argv == ["--help"]:
            continue
        try:
            parser.parse_args(argv)
        except (argparse.ArgumentError, SystemExit) as e:
            pytest.fail(f"{path}: {shlex.join(argv)}: {e}")
        n += 1
    assert n >= 1


def test_every_bench_serving_command_uses_its_flags():
    known = bench_serving_flags()
    assert {"--dataset-name", "--mooncake-slowdown-factor", "--random-input-len"} <= known
    for path, what, argv in all_commands():
        if what == "sglang.bench_serving":
            used = {w for w in argv if w.startswith("--")}
            assert used <= known, f"{path}: {used - known}"
            name = argv[argv.index("--dataset-name") + 1]
            if name in ("random", "mooncake"):  # offline: a shipped file in the repository
                data = argv[argv.index("--dataset-path") + 1]
                assert os.path.isfile(os.path.join(REPO, data)), f"{path}: {data}"


def test_every_flag_the_readme_names_exists(server_parser):
    with open(os.path.join(REPO, "README.md")) as f:
        text = f.read()
    named = flags_named(text)
    assert named and named <= known_flags(server_parser), sorted(named - known_flags(server_parser))


def flags_named(text: str) -> set[str]:
    """Every `--flag` in a text (not a `--pdd-*` family name)."""
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*[a-z0-9])(?![\w-]*\*)", text))


def known_flags(server_parser) -> set[str]:
    return (option_strings(server_parser) | option_strings(router_parser()) | bench_serving_flags() | lab_flags()
            | OTHER_TOOLS)


def test_the_checks_can_fail(server_parser, tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("```bash\npython -m sglang.launch_server --model-path M --pdd-role relay \\\n"
                   "    --disaggregation-mode decode --tp 1 ...   # a comment --not-a-flag\n"
                   "sglang-pdd-router --prefill http://p:1 8998 --wan-mbits 10\n```\n")
    (server, argv), (router, rargv) = commands(str(doc))
    assert server == "sglang.launch_server" and "--not-a-flag" not in argv and "..." not in argv
    with pytest.raises((argparse.ArgumentError, SystemExit)):  # abbreviations are not accepted
        server_parser.parse_args(argv)
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        router_parser().parse_args(rargv)
    ns = server_parser.parse_args([a for a in argv if a not in ("--tp", "1")])
    assert not ns.incremental_streaming_output  # what the decode-role check catches
    named = flags_named("Use `--pdd-*`, `--pdd-role` and --wan-mbits (a typo).")
    assert named == {"--pdd-role", "--wan-mbits"} and named - known_flags(server_parser) == {"--wan-mbits"}
