"""scripts/ab_trees.py's command lines (the timing runs on a device: BENCHMARKS.md)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from ab_trees import build_parser, warm_commands, worker_command  # noqa: E402


def test_the_warm_up_runs_every_tree_case_and_causality_once_with_one_repeat():
    args = build_parser().parse_args(["--before", "old", "--after", "new", "--cases", "tf32:64,fp32:256",
                                      "--causal", "both", "--seqlens", "1024,4096"])
    jobs = warm_commands(args)
    assert len(jobs) == 2 * 2 * 2
    seen = set()
    for tree, cmd in jobs:
        worker = build_parser().parse_args(cmd[2:])  # what the worker process parses
        assert worker.worker == tree and worker.repeats == 1 and worker.seqlens == "1024,4096"
        seen.add((tree, worker.cases, worker.causal))
    assert seen == {(t, c, k) for t in ("old", "new") for c in ("tf32:64", "fp32:256") for k in ("no", "yes")}


def test_one_causality_warms_only_that_one():
    args = build_parser().parse_args(["--before", "old", "--cases", "tf32:64", "--causal", "yes"])
    assert [build_parser().parse_args(cmd[2:]).causal for _, cmd in warm_commands(args)] == ["yes", "yes"]


def test_a_timing_worker_gets_every_case_and_the_repeats():
    args = build_parser().parse_args(["--before", "old", "--cases", "tf32:64,fp32:128", "--repeats", "7"])
    worker = build_parser().parse_args(worker_command("new", args, args.cases, args.causal, args.repeats)[2:])
    assert (worker.worker, worker.cases, worker.repeats, worker.causal) == ("new", "tf32:64,fp32:128", 7, "both")
