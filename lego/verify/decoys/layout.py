"""One grading's layout: the real tests and their decoys under fresh names, written where the tests stood."""

from __future__ import annotations

import ast
import copy
import functools
import random
import secrets
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from lego.verify.decoys.model import (
    COMPLEMENTS,
    FLIP_CALLS,
    NAME_HEX,
    ORDER_SYMBOLS,
    DecoyError,
    DecoyPlan,
    DecoysOfTest,
    NodeId,
    SitePool,
    Variant,
    draw_variants,
    find_function,
    home_function,
    literal,
    parse_python,
)


class _Rewrite(ast.NodeTransformer):
    def __init__(self, target: ast.AST, kind: str, variant: Variant | None, cases: set[str] | None = None):
        self.target, self.kind, self.variant, self.cases = target, kind, variant, cases

    def visit(self, node):
        if node is not self.target or self.variant is None:
            return self.generic_visit(node)
        if self.kind == "value":
            return ast.copy_location(ast.Constant(value=literal(self.variant.replacement)), node)
        if self.kind == "exception":
            return ast.copy_location(ast.Name(id=self.variant.replacement, ctx=ast.Load()), node)
        if self.kind == "bits":
            return ast.copy_location(parse_python(self.variant.replacement, mode="eval").body, node)
        if self.kind == "flip_compare":
            op = COMPLEMENTS[type(node.ops[0])]()
            return ast.copy_location(ast.Compare(left=node.left, ops=[op], comparators=node.comparators), node)
        if self.kind == "param":
            return ast.copy_location(graded_rows(parse_python(self.variant.replacement, mode="eval").body,
                                                 list(self.variant.ids), self.cases), node)
        if self.kind == "flip_assert":
            test = node.test
            flipped = test.operand if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) \
                else ast.UnaryOp(op=ast.Not(), operand=test)
            return ast.copy_location(ast.Assert(test=flipped, msg=node.msg), node)
        if self.kind == "flip_is":
            constant = node.comparators[0].value
            if constant is None:
                op = ast.IsNot() if isinstance(node.ops[0], ast.Is) else ast.Is()
                return ast.copy_location(ast.Compare(left=node.left, ops=[op], comparators=node.comparators), node)
            return ast.copy_location(ast.Compare(left=node.left, ops=node.ops,
                                                 comparators=[ast.Constant(value=not constant)]), node)
        if self.kind == "flip_call":
            func = copy.copy(node.func)
            func.attr = FLIP_CALLS[func.attr]
            return ast.copy_location(ast.Call(func=func, args=node.args, keywords=node.keywords), node)
        if self.kind == "singleton":
            return ast.copy_location(ast.Compare(left=node.left, ops=node.ops, comparators=[
                ast.Constant(value=literal(self.variant.replacement))]), node)
        if self.kind == "order" and isinstance(node, ast.Compare):
            return ast.copy_location(ast.Compare(left=node.left, ops=[ORDER_SYMBOLS[self.variant.replacement]()],
                                                 comparators=node.comparators), node)
        if self.kind == "order":
            func = copy.copy(node.func)
            func.attr = self.variant.replacement
            return ast.copy_location(ast.Call(func=func, args=node.args, keywords=node.keywords), node)
        if self.kind == "flip_raises":
            # The block's body in its place, the manager dropped: what the body raises now leaves the test. The
            # body is visited too, so a check flipped inside it (a pair) is found wherever the rewrites run.
            return [self.visit(statement) for statement in node.body]
        raise DecoyError(f"unknown decoy site kind {self.kind!r}")


def graded_rows(decorator: ast.AST, ids: list[str], cases: set[str] | None) -> ast.AST:
    """A parametrize decorator keeping only the rows of the graded cases (`ids`: each row's id, in order, as the
    real test has it): every member of a group keeps the same rows, and a decoy runs no case nobody grades."""
    if cases is None or not isinstance(decorator, ast.Call) or len(decorator.args) != 2 \
            or not isinstance(decorator.args[1], ast.List) or len(decorator.args[1].elts) != len(ids):
        return decorator
    keep = [index for index, case in enumerate(ids) if case in cases]
    decorator.args[1].elts = [decorator.args[1].elts[index] for index in keep]
    for keyword in decorator.keywords:
        if keyword.arg == "ids" and isinstance(keyword.value, ast.List | ast.Tuple) \
                and len(keyword.value.elts) == len(ids):
            keyword.value.elts = [keyword.value.elts[index] for index in keep]
    return decorator


def render_function(function: ast.FunctionDef | ast.AsyncFunctionDef, member: Member, indent: int,
                    cases: set[str] | None = None) -> str:
    """The function under the member's name, with its site changed to its variant (the real test: unchanged, or
    written as its decoys are). `cases`: the graded cases of a parametrized test (a table site keeps those rows)."""
    clone = copy.deepcopy(function)
    if member.variant is not None and member.site is not None:
        nodes = list(ast.walk(clone))
        if member.kind == "flip_pair":
            changes = [(nodes[index], kind, Variant(family="flip")) for index, kind in member.variant.flips]
        elif member.kind == "accepted":
            changes = [(nodes[index], "value", Variant(replacement=source, family="accepted"))
                       for index, source in member.variant.also]
        else:
            changes = [(nodes[member.site], member.kind, member.variant)]
        for target, kind, variant in changes:  # targets found before any rewrite: a pair's are not nested
            if target is clone:
                raise DecoyError("a decoy site cannot be the test function itself")
            clone = _Rewrite(target, kind, variant, cases).visit(clone)
    clone.name = member.name
    ast.fix_missing_locations(clone)
    text = ast.unparse(clone)
    pad = " " * indent
    return "\n".join(pad + line if line else line for line in text.splitlines())


@dataclass
class Member:
    """One function of a group as it is written into the sandbox."""

    name: str
    role: str  # real | decoy
    site: int | None = None
    kind: str = ""
    variant: Variant | None = None


@dataclass
class Group:
    """A graded test function and its decoys, in the order they are written where the function stood."""

    ref: NodeId
    members: list[Member]
    cases: set[str] | None = None  # the graded cases' ids (a parametrized test's), None: every case


def random_name() -> str:
    return "test_" + secrets.token_hex(NAME_HEX // 2)


def rewrite_module(source: str, groups: list[Group]) -> str:
    """The module with each group's function replaced, where it stood, by its members in their order."""
    module = parse_python(source)
    lines = source.splitlines(keepends=True)
    spans = []
    for group in groups:
        function = find_function(module, group.ref.owner, group.ref.name)
        if function is None:
            raise DecoyError(f"{group.ref.path}: no function {group.ref.name} to rewrite")
        start = min([function.lineno, *(d.lineno for d in function.decorator_list)])
        blocks = [render_function(function, member, function.col_offset, group.cases) for member in group.members]
        gap = "\n\n" if function.col_offset else "\n\n\n"
        spans.append((start, function.end_lineno, gap.join(blocks) + "\n"))
    for start, end, text in sorted(spans, reverse=True):
        lines[start - 1:end] = [text]
    return "".join(lines)


@dataclass
class DecoyLayout:
    """One grading's decoys: what is written into the sandbox, and (host side only) who is who."""

    files: dict[str, str] = field(default_factory=dict)  # path -> rewritten source
    real: dict[str, str] = field(default_factory=dict)  # original test id -> its id in this grading
    decoys: dict[str, str] = field(default_factory=dict)  # decoy id -> the original test id it shadows
    groups: list[list[str]] = field(default_factory=list)  # each graded function's ids (real and decoys), shuffled
    alone: list[int] = field(default_factory=list)  # the groups run alone (FAIL_TO_PASS tests' groups)
    drawn: dict[str, dict] = field(default_factory=dict)  # original test id -> the site and values drawn (evidence)
    unrewritable: dict[str, str] = field(default_factory=dict)  # a test file left as it was, and why
    members: dict[str, Member] = field(default_factory=dict)  # every graded id -> the function written for it

    @classmethod
    def identity(cls, tests: list[str], alone: list[str]) -> DecoyLayout:
        """Every test under its own name and no decoy (the tests as the task wrote them)."""
        groups = [[test] for test in dict.fromkeys(tests)]
        return cls(real={test: test for test in tests}, groups=groups,
                   alone=[index for index, group in enumerate(groups) if group[0] in set(alone)])

    @property
    def graded(self) -> list[str]:
        return [*self.real.values(), *self.decoys]

    def decoys_of(self, test: str) -> list[str]:
        return [decoy for decoy, original in self.decoys.items() if original == test]


def literal_counts(nodes: Iterable[ast.AST]) -> Counter:
    """How often each literal and name (imported names included) appears among `nodes`."""
    counts: Counter = Counter()
    for node in nodes:
        if isinstance(node, ast.Constant | ast.Name):
            counts[ast.unparse(node)] += 1
        elif isinstance(node, ast.alias):
            counts[node.asname or node.name.rsplit(".", 1)[-1]] += 1
    return counts


@functools.lru_cache(maxsize=64)
def _module_literal_counts(source: str) -> Counter:
    """A module's counts, once per source: every group of a module is judged against the same rest."""
    return literal_counts(ast.walk(parse_python(source)))


def mentions_outside(source: str, inside: Iterable[ast.AST]) -> Counter:
    """How often each literal and name appears in the module `source` outside the subtrees `inside` (nodes of that
    source's tree), counted without walking the module again for each group."""
    nodes = {id(node): node for root in inside for node in ast.walk(root)}
    return _module_literal_counts(source) - literal_counts(nodes.values())


@dataclass
class _Context:
    """What a forger can read beside a group: the rest of its module. A decoy value must look like the real one
    there: mentioned elsewhere in the module or not, found inside the module's other text or not, of the same
    length. Otherwise "the value the fixture mentions" or "the one no other test uses" would pick the real test."""

    function: ast.FunctionDef | ast.AsyncFunctionDef
    rest_text: str
    rest_literals: Counter

    @classmethod
    def of(cls, source: str | None, ref: NodeId) -> _Context | None:
        if source is None:
            return None
        try:
            module = parse_python(source)
        except SyntaxError:
            return None
        _, owner, name = home_function(module, ref.function)
        function = find_function(module, owner, name)
        if function is None:
            return None
        start = min([function.lineno, *(d.lineno for d in function.decorator_list)])
        lines = source.splitlines()
        rest_text = "\n".join(lines[:start - 1] + lines[function.end_lineno:])
        return cls(function, rest_text, mentions_outside(source, [function]))

    def profile(self, text: str, kind: str) -> tuple:
        if kind == "exception":
            return (self.rest_literals[text] > 0, len(text) // 5)
        try:
            value = literal(text)
        except (ValueError, SyntaxError):
            return ()
        content = value.decode("latin-1") if isinstance(value, bytes) else value if isinstance(value, str) \
            else repr(value)
        length = len(text) if len(text) <= 6 else len(text) // 4 + 100
        return (self.rest_literals[text] > 0, bool(content) and content in self.rest_text, length)

    def matching(self, pool: SitePool) -> tuple[SitePool, int]:
        """The pool's variants whose profile is the real value's, and how many features of it they share: all of
        them when any variant does, else relaxed one feature at a time (length first)."""
        if pool.kind not in ("value", "exception"):
            return pool, 0
        nodes = list(ast.walk(self.function))
        if pool.site >= len(nodes):
            return pool, 0
        real = self.profile(ast.unparse(nodes[pool.site]), pool.kind)
        for width in range(len(real), -1, -1):
            kept = [v for v in pool.variants if self.profile(v.replacement, pool.kind)[:width] == real[:width]]
            if kept:
                return pool.model_copy(update={"variants": kept}), width - len(real)
        return pool, -len(real)


def _shown(member: Member) -> str:
    """A decoy's value in the evidence (a parametrize table's variant by its offset: the table is long)."""
    if member.variant is None:
        return "flip"
    if member.kind == "param":
        return f"every row's expectation moved by {member.variant.offset} ({member.variant.family})"
    if member.kind == "flip_pair":
        return "flipped " + ", ".join(f"{kind} at {index}" for index, kind in member.variant.flips)
    return member.variant.replacement


def build_layout(sources: dict[str, str], plan: DecoyPlan, fail_to_pass: list[str], pass_to_pass: list[str], *,
                 k: int, pass_to_pass_sample: int, rng: random.Random | None = None) -> DecoyLayout:
    """Rename every graded test, add up to k decoys drawn from `plan` to every FAIL_TO_PASS test and to a random
    sample of PASS_TO_PASS tests, and shuffle each group where its function stood."""
    rng = rng or random.SystemRandom()
    with_decoys = set(fail_to_pass)
    sampled = [t for t in pass_to_pass if t in plan.tests and plan.tests[t].pools]
    with_decoys.update(rng.sample(sampled, min(pass_to_pass_sample, len(sampled))))

    contexts: dict[tuple[str, str | None, str], _Context | None] = {}

    def members_of(tests: list[str]) -> list[Member]:
        real = Member(random_name(), "real")
        members = [real]
        # The ids of one function share its sites (plan_candidates): the first with any stands for all.
        pools = next((plan.tests[test].pools for test in tests if test in plan.tests and plan.tests[test].pools), [])
        if pools and any(test in with_decoys for test in tests):
            ref = NodeId.parse(tests[0])
            if ref.function not in contexts:
                contexts[ref.function] = _Context.of(sources.get(ref.path), ref)
            context = contexts[ref.function]
            # Each site ranked by: on a line the test patch wrote; its kind (a changed value hides best, then a
            # swapped exception, then a flipped truth: lego bench decoys measures each); its decoys matching the
            # real value on every feature a forger can read beside them; how many decoys it gives. All decoys
            # change the one site.
            ranked = []
            for pool in pools:
                matched, fit = context.matching(pool) if context is not None else (pool, 0)
                strength = {"value": 2, "param": 2, "bits": 2, "accepted": 2, "exception": 1, "singleton": 1, "order": 1}.get(
                    pool.kind, 0)
                size = len(draw_variants(matched, k, random.Random(0)))
                ranked.append(((matched.written, strength, fit, size), matched))
            best = max(rank for rank, _ in ranked)
            pool = rng.choice([matched for rank, matched in ranked if rank == best])
            members += [Member(random_name(), "decoy", pool.site, pool.kind, variant)
                        for variant in draw_variants(pool, k, rng)]
            if pool.real and len(members) > 1:  # written as its decoys are (a parametrize table spelled out)
                cases = list(members[1].variant.ids)
                real.site, real.kind = pool.site, pool.kind
                real.variant = Variant(replacement=pool.real, family="real", ids=dict(zip(cases, cases, strict=True)))
        rng.shuffle(members)
        return members

    # A decoy is judged on the cases its site was validated on (a parametrized test's planned cases): its other
    # cases run, but a case no gold run saw fail is no evidence either way.
    validated = {test for test, found in plan.tests.items() if found.pools}
    return _layout(sources, fail_to_pass, pass_to_pass, members_of, rng, untouched=plan.untouched,
                   decoy_tests=validated)


def validation_layout(sources: dict[str, str], candidates: dict[str, DecoysOfTest], fail_to_pass: list[str],
                      pass_to_pass: list[str]) -> DecoyLayout:
    """Every candidate variant of every site as a decoy of its own: what runs under the gold patch to find the
    variants that fail there (Verifier.decoy_plan)."""
    def members_of(tests: list[str]) -> list[Member]:
        found = next((candidates[test] for test in tests if test in candidates), None)
        members = [Member(random_name(), "real")] + [
            Member(random_name(), "decoy", pool.site, pool.kind, variant)
            for pool in (found.pools if found else []) for variant in pool.variants]
        rng.shuffle(members)  # decoys before the real test too, as at a grading
        return members

    rng = random.SystemRandom()
    return _layout(sources, fail_to_pass, pass_to_pass, members_of, rng, decoy_tests=set(candidates))


def homes(sources: dict[str, str], functions: list[tuple[str, str | None, str]]) -> dict[
        tuple[str, str | None, str], tuple[str, str | None, str] | None]:
    """Each graded function -> where it is written (`home_function`: a method a graded subclass inherits is written
    in its base class, and its decoys there are inherited alike), or None for an inherited method whose class
    cannot be resolved in the module: renamed where it is written, the subclass's test would be gone."""
    modules: dict[str, ast.Module | None] = {}
    found: dict[tuple[str, str | None, str], tuple[str, str | None, str] | None] = {}
    for function in functions:
        path, owner, name = function
        if path not in modules:
            try:
                modules[path] = parse_python(sources[path]) if path in sources else None
            except (SyntaxError, ValueError):
                modules[path] = None
        module = modules[path]
        home = home_function(module, function)
        if module is not None and home[1] is not None and "::" not in home[1] \
                and find_function(module, home[1], name) is None:
            home = None
        found[function] = home
    return found


def _layout(sources: dict[str, str], fail_to_pass: list[str], pass_to_pass: list[str], members_of,
            rng: random.Random, untouched: dict[str, str] | None = None,
            decoy_tests: set[str] | None = None) -> DecoyLayout:
    """`decoy_tests`: the graded tests whose decoys are judged (None: all); a decoy's other cases get no id."""
    layout = DecoyLayout()
    tests_of: dict[tuple[str, str | None, str], list[str]] = {}
    for test in dict.fromkeys([*fail_to_pass, *pass_to_pass]):
        tests_of.setdefault(NodeId.parse(test).function, []).append(test)
    home_of = homes(sources, list(tests_of))
    by_function: dict[tuple[str, str | None, str], list[str]] = {}
    for function, tests in tests_of.items():
        by_function.setdefault(home_of[function] or function, []).extend(tests)
    per_file: dict[str, list[Group]] = {}
    ids_of: dict[tuple[str, str | None, str], list[str]] = {}
    for function, tests in by_function.items():
        if any(home_of[NodeId.parse(test).function] is None for test in tests):
            # An inherited method whose class the module does not resolve: graded as it is, under its own name, with
            # no decoy.
            ids_of[function] = list(tests)
            layout.real.update({test: test for test in tests})
            continue
        members = members_of(tests)
        cases = {NodeId.parse(test).params[1:-1] for test in tests}
        path, owner, name = function
        per_file.setdefault(path, []).append(Group(NodeId(path, owner, name, NodeId.parse(tests[0]).params), members,
                                                   cases if all(NodeId.parse(t).params for t in tests) else None))
        ids_of[function] = []
        for test in tests:
            ref = NodeId.parse(test)
            for member in members:
                if member.role == "decoy" and decoy_tests is not None and test not in decoy_tests:
                    continue
                renamed = ref.renamed(member.name)
                if member.variant is not None and member.variant.ids and ref.params:
                    # A parametrize table's decoy: its cases are named from its own values.
                    params = member.variant.ids.get(ref.params[1:-1], ref.params[1:-1])
                    renamed = NodeId(ref.path, ref.owner, member.name, f"[{params}]").renamed(member.name)
                ids_of[function].append(renamed)
                layout.members[renamed] = member
                if member.role == "real":
                    layout.real[test] = renamed
                else:
                    layout.decoys[renamed] = test
                    layout.drawn.setdefault(test, {"site": member.site, "kind": member.kind, "values": []})[
                        "values"].append(_shown(member))
    for path, groups in per_file.items():
        try:
            if path not in sources:
                raise DecoyError("the file is not in the repository after the test patch")
            if untouched and path in untouched:
                raise DecoyError(untouched[path])
            layout.files[path] = rewrite_module(sources[path], groups)
        except (SyntaxError, ValueError, DecoyError) as exc:
            # A file this interpreter cannot parse or print (or one that is missing: its tests will be missing too)
            # is graded as it is, under its own names; the evidence says so.
            layout.unrewritable[path] = f"{type(exc).__name__}: {exc}"[:300]
            for group in groups:
                tests = [test for test in layout.real
                         if (home_of.get(NodeId.parse(test).function) or NodeId.parse(test).function) == group.ref.function]
                for test in tests:
                    layout.real[test] = test
                    layout.drawn.pop(test, None)
                    for decoy in layout.decoys_of(test):
                        del layout.decoys[decoy]
                        layout.members.pop(decoy, None)
                ids_of[group.ref.function] = tests
    alone = {home_of[NodeId.parse(test).function] or NodeId.parse(test).function for test in fail_to_pass}
    for function, ids in ids_of.items():
        ids = list(ids)
        rng.shuffle(ids)
        if function in alone:
            layout.alone.append(len(layout.groups))
        layout.groups.append(ids)
    return layout
