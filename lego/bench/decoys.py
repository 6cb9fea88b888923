"""`lego bench decoys`: can a forger that reads a group of tests tell the real one from its decoys?

For each task of the configured task set (its decoy plan made or read from the cache), many gradings' layouts are
drawn, and for every FAIL_TO_PASS test with decoys, simple strategies a forger could run inside the sandbox pick
one member of the group: the median of numeric values, the value the module mentions most elsewhere, the shortest
value, the first member in the file, and, for flipped truths, the member without a negation. The hit rate of each
is compared with the blind bound 1/(k+1). No test is run: the layouts are what a grading writes.
"""

from __future__ import annotations

import ast
import random
import statistics
import time
from collections import Counter
from typing import Any

from lego.bench import register
from lego.config import LegoConfig
from lego.workdir import WorkDir

DRAWS_PER_TASK = 200


class _Module:
    """One rewritten module as a forger reads it, parsed once for all its groups."""

    def __init__(self, source: str) -> None:
        self.source = source
        module = ast.parse(source)
        self.functions: dict[str, ast.AST] = {}
        for node in ast.walk(module):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                self.functions[node.name] = node
        self.function_text = {name: ast.unparse(fn) for name, fn in self.functions.items()}
        self.module_text = "\n".join(ast.unparse(node) for node in module.body
                                     if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef))
        self._by_name: dict[str, list[ast.AST]] = {}
        for node in ast.walk(module):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                self._by_name.setdefault(node.name, []).append(node)

    def mentions_outside(self, group: set[str]) -> Counter:
        """How often each literal or name appears outside the group's functions (what a forger can cross-read)."""
        from lego.verify.decoys import mentions_outside

        return mentions_outside(self.source, [fn for name in group for fn in self._by_name.get(name, [])])

    def other_text(self, group: set[str]) -> str:
        return "\n".join(text for name, text in self.function_text.items() if name not in group) + self.module_text


def _site_text(function: ast.AST, site: int) -> str:
    """The node at the site's index in this member (a decoy whose block was dropped has fewer nodes)."""
    nodes = list(ast.walk(function))
    return ast.unparse(nodes[site]) if site < len(nodes) else ""


def _number(text: str) -> float | None:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _content(text: str) -> str:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
    return value.decode("latin-1") if isinstance(value, bytes) else value if isinstance(value, str) else repr(value)


def guesses(members: list[str], texts: dict[str, str], order: list[str], mentions: Counter, other_text: str,
            rng: random.Random, kind: str) -> dict[str, str]:
    """Each strategy's pick among `members` (function names), from the site's text in each member. Each feature
    is tried in both directions: a strategy far below the blind rate means its opposite is far above it."""
    numbers = {m: _number(texts[m]) for m in members}
    found = {m: bool(_content(texts[m])) and _content(texts[m]) in other_text for m in members}

    def pick(key) -> str:
        return min(members, key=lambda m: (key(m), rng.random()))

    picks = {"first_in_file": min(members, key=order.index), "last_in_file": max(members, key=order.index),
             "shortest": pick(lambda m: len(texts[m])), "longest": pick(lambda m: -len(texts[m])),
             "most_mentioned": pick(lambda m: -mentions[texts[m]]), "least_mentioned": pick(lambda m: mentions[texts[m]]),
             "found_in_other_text": pick(lambda m: not found[m]), "not_found_in_other_text": pick(lambda m: found[m]),
             "random": rng.choice(members)}
    if all(value is not None for value in numbers.values()):
        ranked = sorted(members, key=lambda m: numbers[m])
        picks["median"] = ranked[len(ranked) // 2]
    if kind.startswith("flip"):
        picks["no_negation"] = min(members, key=lambda m: ("not " in texts[m] or "False" in texts[m]
                                                          or "assertFalse" in texts[m] or "IsNot" in texts[m],
                                                          rng.random()))
        picks["expects_exception"] = min(members, key=lambda m: (not texts[m].startswith("with "), rng.random()))
    if kind in ("order", "singleton"):
        picks["equality_or_none"] = min(members, key=lambda m: (not any(
            mark in texts[m] for mark in (" == ", "assertEqual", "is None")), rng.random()))
    return picks


def strategy_hits(layout, tests: list[str], rng: random.Random) -> list[tuple[str, int, dict[str, int]]]:
    """For each of `tests` with decoys in this layout: (site kind, decoys, {strategy: 1 if it picked the real
    member}), each strategy reading only what the sandbox holds (the rewritten module)."""
    from lego.verify.decoys import NodeId

    judged = []
    modules: dict[str, _Module] = {}
    for test in tests:
        decoys = layout.decoys_of(test)
        if not decoys or test not in layout.real:
            continue
        path = test.split("::")[0]
        if path not in modules:
            modules[path] = _Module(layout.files[path])
        module = modules[path]
        member = layout.members[decoys[0]]
        names = [NodeId.parse(layout.real[test]).name, *(NodeId.parse(d).name for d in decoys)]
        texts = {name: _site_text(module.functions[name], member.site) for name in names}
        order = [n for n in module.functions if n in names]
        mentions = module.mentions_outside(set(names))
        other_text = module.other_text(set(names))
        picks = guesses(names, texts, order, mentions, other_text, rng, member.kind)
        judged.append((member.kind, len(decoys), {name: int(pick == names[0]) for name, pick in picks.items()}))
    return judged


@register("decoys")
def bench_decoys(config: LegoConfig, work: WorkDir) -> dict[str, Any]:
    from lego.sandbox.daemon import docker_engine
    from lego.sandbox.image import ensure_base_image
    from lego.tasksets.load import load_tasks
    from lego.tasksets.task import is_harbor_task
    from lego.verify.decoys import build_layout
    from lego.verify.grader import Verifier
    from lego.verify.pytest_grading import RUNNER_DIR, RUNNER_MOUNT

    started = time.perf_counter()
    k = config.verify.decoys_per_test
    tasks = [t for t in load_tasks(config.tasks.source, "all", strict=True, limit=config.tasks.limit).tasks
             if not is_harbor_task(t)]
    hits: dict[str, list[int]] = {}
    by_kind: dict[str, dict[str, list[int]]] = {}
    sizes: list[int] = []
    written = total_sites = 0
    with docker_engine(work.docker_root, config.docker.host, config.docker.start_private_daemon) as engine:
        base = ensure_base_image(engine.client, config.docker)
        verifier = Verifier(engine.client, base, config.sandbox, config.verify)
        for task in tasks:
            plan = verifier.pytest_grading.decoy_plan(task)
            with verifier.factory.open_task(task, purpose="bench", mounts={str(RUNNER_DIR): RUNNER_MOUNT}) as box:
                sources = verifier.pytest_grading.read_graded_sources(box, task)
            for pools in (plan.tests[t].pools for t in task.FAIL_TO_PASS if t in plan.tests):
                total_sites += len(pools)
                written += sum(pool.written for pool in pools)
            rng = random.Random(task.instance_id)
            for draw in range(DRAWS_PER_TASK):
                layout = build_layout(sources, plan, list(task.FAIL_TO_PASS), list(task.PASS_TO_PASS), k=k,
                                      pass_to_pass_sample=0, rng=random.Random(rng.random() + draw))
                for kind, size, picks in strategy_hits(layout, list(task.FAIL_TO_PASS), rng):
                    sizes.append(size)
                    for strategy, hit in picks.items():
                        hits.setdefault(strategy, []).append(hit)
                        by_kind.setdefault(kind, {}).setdefault(strategy, []).append(hit)
    rate = {name: round(statistics.fmean(values), 3) for name, values in sorted(hits.items())}
    return {
        "benchmark": "decoys",
        "tasks": len(tasks),
        "draws_per_task": DRAWS_PER_TASK,
        "k": k,
        "groups_judged": len(sizes),
        "mean_decoys_per_fail_to_pass_test": round(statistics.fmean(sizes), 3) if sizes else 0,
        "blind_bound": round(1 / (k + 1), 3),
        "hit_rate": rate,
        "hit_rate_by_site_kind": {kind: {name: round(statistics.fmean(v), 3) for name, v in sorted(values.items())}
                                  for kind, values in sorted(by_kind.items())},
        "fail_to_pass_sites_on_written_lines": f"{written}/{total_sites}",
        "wall_seconds": round(time.perf_counter() - started, 1),
    }
