"""The candidate variants of each site of a test, before the gold patch validates them."""

from __future__ import annotations

import ast
import copy
import math
import random
import re
import secrets
import string

from lego.verify.decoys.expressions import (
    PUNCTUATION,
    expectation_leaves,
    expectation_shaped,
    node_value,
    text_positions,
)
from lego.verify.decoys.model import (
    EXCEPTIONS,
    MAX_SITES_PER_TEST,
    MAX_VARIANTS_PER_SITE,
    ORDER_CALLS,
    ORDER_OPS,
    ORDER_SYMBOLS,
    SINGLETONS,
    DecoysOfTest,
    NodeId,
    SitePool,
    Variant,
    home_function,
    literal,
    parse_python,
)
from lego.verify.decoys.params import ParamTable, render_param
from lego.verify.decoys.reached import escapes
from lego.verify.decoys.sites import locate_sites


def _decimals(value: float) -> int:
    text = repr(value)
    if "e" in text or "E" in text:
        return 12
    return len(text.split(".")[1]) if "." in text else 0


def number_candidates(value: int | float, k: int, rng: random.Random) -> list[Variant]:
    """A progression around the real value, several steps: a grading takes k+1 consecutive terms containing it."""
    if isinstance(value, int):
        steps = sorted({1, rng.choice([2, 3, 5])} | ({max(1, abs(value) // 10)} if abs(value) >= 20 else set()))[:2]
        variants = [Variant(replacement=repr(value + step * j), family=f"step:{step}", offset=j)
                    for step in steps for j in range(-k, k + 1) if j]
        return variants
    magnitude = 10.0 ** math.floor(math.log10(abs(value))) if value else 1.0
    decimals = _decimals(value)
    out = []
    for factor in (1, rng.choice([2, 5])):
        step = magnitude * factor
        places = max(decimals, _decimals(step))
        for j in range(-k, k + 1):
            if j:
                shifted = round(value + step * j, places)
                if shifted != value:
                    out.append(Variant(replacement=repr(float(shifted)), family=f"step:{factor}", offset=j))
    return out


def _same_class(char: str) -> str:
    if char in PUNCTUATION:
        return PUNCTUATION
    if char.isdigit():
        return string.digits
    if char.isupper():
        return string.ascii_uppercase
    return string.ascii_lowercase


def _tokens(inputs: str) -> list[str]:
    return [token for token in re.split(r"[^0-9A-Za-z]+", inputs) if token]


def _shared(text: str, position: int, inputs: str, tokens: list[str]) -> bool:
    """Whether the character at `position` is part of a likeness between `text` and `inputs` (a two-character
    window they share, a one-character word, the first or last character of a word): changing it would make the
    decoy look less like the test's other text than the real value does, which a forger can read."""
    char = text[position]
    before, after = text[max(0, position - 1):position], text[position + 1:position + 2]
    return bool(before and before + char in inputs or after and char + after in inputs or char in tokens
                or position == 0 and any(token.startswith(char) for token in tokens)
                or position == len(text) - 1 and any(token.endswith(char) for token in tokens))


def _fresh(text: str, position: int, inputs: str) -> list[str]:
    """The characters of the same class that may replace the one at `position` without making a window the inputs
    have (a likeness the real value lacks)."""
    char = text[position]
    before, after = text[max(0, position - 1):position], text[position + 1:position + 2]
    return [c for c in _same_class(char) if c.lower() != char.lower()
            and not (before and before + c in inputs) and not (after and c + after in inputs)]


def text_candidates(value: str | bytes, k: int, rng: random.Random, positions: int = 2,
                    inputs: str = "") -> list[Variant]:
    """One character changed, at one position, to others of its class (never a case change: a case-insensitive
    comparison must not pass a decoy). All of a grading's decoys change the same position. With `inputs` (the
    test's other text), positions and characters that keep its likeness to that text are preferred (`_shared`)."""
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    eligible = text_positions(text)
    tokens = _tokens(inputs)
    eligible = [i for i in eligible if not _shared(text, i, inputs, tokens)] or eligible
    out = []
    for position in rng.sample(eligible, min(positions, len(eligible))):
        char = text[position]
        pool = _fresh(text, position, inputs)
        pool = pool if len(pool) >= k else [c for c in _same_class(char) if c.lower() != char.lower()]
        for new in rng.sample(pool, min(len(pool), max(k + 2, 4))):
            changed = text[:position] + new + text[position + 1:]
            literal = changed.encode("latin-1") if isinstance(value, bytes) else changed
            out.append(Variant(replacement=repr(literal), family=f"pos:{position}"))
    return out


def module_vocabulary(module: ast.Module) -> tuple[list, list[str]]:
    """The literals and the exception names a test module itself uses: decoy values drawn from them look as much
    at home in the file as the real one (a perturbed 'client' next to a fixture that says 'client' would not)."""
    docstrings = {id(node.body[0].value) for node in ast.walk(module)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    literals, exceptions = [], []
    for node in ast.walk(module):
        if isinstance(node, ast.Constant) and id(node) not in docstrings and not isinstance(node.value, bool) \
                and isinstance(node.value, int | float | str | bytes):
            literals.append(node.value)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) \
                and type(node.operand.value) in (int, float):
            literals.append(-node.operand.value)
        elif isinstance(node, ast.Name) and node.id.endswith(("Error", "Exception")):
            exceptions.append(node.id)
        elif isinstance(node, ast.alias) and (node.asname or node.name).endswith(("Error", "Exception")):
            exceptions.append(node.asname or node.name)
    return list(dict.fromkeys(literals)), list(dict.fromkeys(exceptions))


def _same_shape(value, other) -> bool:
    if type(value) is not type(other) or value == other:
        return False
    if isinstance(value, str | bytes):
        newline = "\n" if isinstance(value, str) else b"\n"
        return (newline in value) == (newline in other) and len(value) // 2 <= len(other) <= 2 * len(value) + 2
    return True


def vocabulary_candidates(value, literals: list, k: int, rng: random.Random) -> list[Variant]:
    """Other literals of the module, of the value's type and shape."""
    fits = [other for other in literals if _same_shape(value, other)]
    chosen = rng.sample(fits, min(len(fits), max(2 * k, 4)))
    return [Variant(replacement=repr(other), family="module") for other in chosen] if len(chosen) >= k else []


def exception_candidates(original: str, in_module: list[str], k: int, rng: random.Random) -> list[Variant]:
    """Exception types the module itself names first, then builtins; none related to a builtin real type by
    inheritance (a custom type's relations are unknown here: the gold run drops a related one)."""
    import builtins

    real = getattr(builtins, original, None)

    def unrelated(name: str) -> bool:
        candidate = getattr(builtins, name, None)
        if name == original.rsplit(".", 1)[-1]:
            return False
        if isinstance(real, type) and isinstance(candidate, type) and issubclass(candidate, BaseException):
            return not (issubclass(real, candidate) or issubclass(candidate, real))
        return True

    local = [name for name in in_module if unrelated(name)]
    common = [name for name in EXCEPTIONS if unrelated(name) and name not in local]
    chosen = rng.sample(local, min(len(local), 2 * k)) + rng.sample(common, min(len(common), max(2 * k, 6)))
    return [Variant(replacement=name, family="swap") for name in chosen]


def _text_of(node: ast.AST) -> str:
    return " ".join(str(node_value(leaf)) for leaf in expectation_leaves(node)) if expectation_shaped(node) else ast.unparse(node)


def _row_move(leaves: list[ast.AST], inputs: str, k: int, rng: random.Random) -> tuple | None:
    """How one row's expectation moves in every variant of a family: a leaf, and for a number its step, for a
    string one position and the 2k characters it takes. Nothing the row's inputs share with its expectation is
    moved (a decoy that breaks a likeness with the inputs, `fish` -> `fish` made `fizh`, would show the real one):
    a string moves at a character no two-character window of the inputs has, to one that makes no such window; a
    number moves only when the inputs do not spell it. None: the row cannot move (its case fails no decoy)."""
    options = []
    for leaf in leaves:
        value = node_value(leaf)
        if isinstance(value, int | float):
            if repr(value) not in inputs and str(abs(value)) not in inputs:
                step = 1 if isinstance(value, int) else (10.0 ** math.floor(math.log10(abs(value))) if value else 1.0)
                options.append((leaf, value, step, 0, ""))
            continue
        text = value.decode("latin-1") if isinstance(value, bytes) else value
        tokens = _tokens(inputs)
        for position, char in enumerate(text):
            if not (char.isascii() and char.isalnum()) or _shared(text, position, inputs, tokens):
                continue
            pool = _fresh(text, position, inputs)
            if len(pool) >= 2 * k:
                options.append((leaf, value, 0, position, "".join(rng.sample(pool, 2 * k))))
    return rng.choice(options) if options else None


def param_candidates(table: ParamTable, names: set[str], k: int, rng: random.Random) -> tuple[str, list[Variant]]:
    """The parametrize decorator as the real test is written at a grading (its rows in it), and variants of it in
    which every row's expectation is moved: one leaf of the row's expected values, by the same offset in every row
    (numbers: a step of the leaf's magnitude; strings: one character at one position, drawn once per row from the
    same class; see `_row_move`). Every case of the test fails in each variant, whichever cases are graded; each
    variant names its cases from its own values (Variant.ids)."""
    positions = [index for index, name in enumerate(table.argnames) if name in names]
    variants = []
    for family in range(2):
        moves = []
        for cells in table.values:
            leaves = [leaf for position in positions if expectation_shaped(cells[position]) for leaf in expectation_leaves(cells[position])]
            inputs = " ".join(_text_of(cell) for index, cell in enumerate(cells) if index not in positions)
            move = _row_move(leaves, inputs, k, rng)
            if move is not None:
                moves.append(move)
        if not moves:
            return "", []
        for rank, offset in enumerate(j for j in range(-k, k + 1) if j):
            changed: dict[int, ast.AST] = {}
            for leaf, value, step, position, chars in moves:
                if step:
                    places = max(_decimals(value), _decimals(step)) if isinstance(value, float) else 0
                    new = value + step * offset if isinstance(value, int) else round(value + step * offset, places)
                else:
                    text = value.decode("latin-1") if isinstance(value, bytes) else value
                    new = text[:position] + chars[rank] + text[position + 1:]
                    new = new.encode("latin-1") if isinstance(value, bytes) else new
                changed[id(leaf)] = ast.Constant(value=new)
            ids = table.ids_with(changed)
            if ids is None:
                continue
            variants.append(Variant(replacement=render_param(table, changed), family=f"step:table{family}",
                                    offset=offset, ids=dict(zip(table.ids, ids, strict=True))))
    return render_param(table), variants


def alternatives(node: ast.AST) -> list[str]:
    """What a singleton or an order site may check instead: the other constants of `is None/True/False`, the two
    other comparisons of <, == and > (as operators, or as assertEqual/assertLess/assertGreater)."""
    if isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.Is):
        return [repr(value) for value in SINGLETONS if value is not node.comparators[0].value]
    if isinstance(node, ast.Compare):
        symbols = {op: symbol for symbol, op in ORDER_SYMBOLS.items()}
        return [symbols[op] for op in ORDER_OPS[type(node.ops[0])]]
    return list(ORDER_CALLS[node.func.attr])


def _pairable(nodes: list[ast.AST], a: tuple[int, str], b: tuple[int, str]) -> bool:
    """Two flips that may change together: neither inside the other, or the inner one inside an expected-exception
    block whose body it would fail out of (the block dropped and the inner check flipped, the decoy still fails)."""
    outer, inner = (a, b) if id(nodes[b[0]]) in {id(node) for node in ast.walk(nodes[a[0]])} else (b, a)
    if id(nodes[inner[0]]) not in {id(node) for node in ast.walk(nodes[outer[0]])}:
        return True
    return outer[1] == "flip_raises" and escapes(nodes[outer[0]], nodes[inner[0]])


def flip_pair_candidates(nodes: list[ast.AST], flips: list[tuple[int, str]], rng: random.Random,
                         families: int = 3) -> list[Variant]:
    """Two truth checks of a test flipped together, as `bits_candidates` changes two truth values: the three other
    combinations of the pair, one family per pair (k of the three are drawn: with the real one, any three of the
    four, each as likely). A test whose only checks are truths gets k decoys this way, not one. Checks nested in
    one another are paired only as `_pairable` says (flipping the outer one would otherwise rewrite the inner)."""
    pairs = [(a, b) for position, a in enumerate(flips) for b in flips[position + 1:] if _pairable(nodes, a, b)]
    variants = []
    for a, b in rng.sample(pairs, min(families, len(pairs))):
        for chosen in ([a], [b], [a, b]):
            variants.append(Variant(family=f"pair:{a[0]},{b[0]}", flips=chosen))
    return variants


def _other_text(function: ast.AST, leaf: ast.AST) -> str:
    """The test's text a value at `leaf` is read beside: every other string and number it writes."""
    return "\n".join(str(node.value) for node in ast.walk(function) if node is not leaf
                      and isinstance(node, ast.Constant) and isinstance(node.value, str | int | float))


def plan_candidates(source: str, tests: list[str], k: int, rng: random.Random | None = None,
                    written_lines: set[int] | None = None) -> dict[str, DecoysOfTest]:
    """Every candidate variant of every site of `tests` (ids in this one file), before validation. With
    `written_lines` (the lines of this file the test patch wrote), sites on those lines come first. The ids of one
    function (a parametrized test's cases) share its sites and variants: they are graded as one group."""
    rng = rng or random.Random(secrets.randbits(64))
    module = parse_python(source)
    literals, exceptions = module_vocabulary(module)
    plans: dict[str, DecoysOfTest] = {}
    by_function: dict[tuple[str, str | None, str], list[str]] = {}
    for test in tests:
        by_function.setdefault(home_function(module, NodeId.parse(test).function), []).append(test)
    for (path, owner, name), ids in by_function.items():
        ref = NodeId(path, owner, name, NodeId.parse(ids[0]).params)  # a method inherited: where it is written
        sites, finder = locate_sites(module, ref, ids)
        if finder is None:
            for test in ids:
                plans[test] = DecoysOfTest(test=test, reason="the test function is not defined in its file")
            continue
        nodes = list(ast.walk(finder.function))
        if written_lines is not None:
            sites.sort(key=lambda site: getattr(nodes[site[0]], "lineno", 0) not in written_lines)  # stable
        pools = []
        for index, kind in sites[:MAX_SITES_PER_TEST * 3]:
            node, real = nodes[index], ""
            if kind == "value":
                value = node_value(node)
                if isinstance(value, bool):
                    continue
                variants = vocabulary_candidates(value, literals, k, rng) + (
                    number_candidates(value, k, rng) if isinstance(value, int | float)
                    else text_candidates(value, k, rng, inputs=_other_text(finder.function, node)))
            elif kind == "param":
                real, variants = param_candidates(finder.param, finder.param_names, k, rng)
            elif kind == "bits":
                variants = bits_candidates(node, rng)
            elif kind == "accepted":
                variants = accepted_candidates(finder.accepted_members(node) or [], nodes, k, rng)
            elif kind == "exception":
                original = node.id if isinstance(node, ast.Name) else ast.unparse(node)
                variants = exception_candidates(original, exceptions, k, rng)
            elif kind in ("singleton", "order"):
                variants = [Variant(replacement=other, family=kind) for other in alternatives(node)]
            else:
                variants = [Variant(family="flip")]
            if variants:
                lines = {getattr(node, "lineno", 0)} if kind != "param" else {
                    getattr(leaf, "lineno", 0) for cells in finder.param.values for leaf in
                    (expectation_leaves(cells[finder.param.argnames.index(name)]) for name in finder.param_names)
                    for leaf in leaf}
                written = written_lines is None or lines <= written_lines
                pools.append(SitePool(site=index, kind=kind, variants=variants[:MAX_VARIANTS_PER_SITE],
                                      written=written, real=real))
            if len(pools) >= MAX_SITES_PER_TEST:
                break
        pools = _with_flip_pair(pools, sites, nodes, rng, written_lines)
        reason = "" if pools else ("no checked expectation to change: the test compares no literal, asserts no "
                                   "truth and expects no exception in its own body or a helper of its module")
        for test in ids:
            plans[test] = DecoysOfTest(test=test, pools=[pool.model_copy(deep=True) for pool in pools], reason=reason)
    return plans


def _with_flip_pair(pools: list[SitePool], sites: list[tuple[int, str]], nodes: list[ast.AST], rng: random.Random,
                    written_lines: set[int] | None) -> list[SitePool]:
    """The pools with the test's single flips replaced by a pair of them (`flip_pair_candidates`), where it has two
    truth checks or more: a single flip gives one decoy, a pair k."""
    flips = [(index, kind) for index, kind in sites if kind.startswith("flip_")]
    if written_lines is not None:
        on_written = [flip for flip in flips if getattr(nodes[flip[0]], "lineno", 0) in written_lines]
        flips = on_written if len(on_written) >= 2 else flips
    variants = flip_pair_candidates(nodes, flips, rng)
    if not variants:
        return pools
    lines = {getattr(nodes[index], "lineno", 0) for variant in variants for index, _ in variant.flips}
    pair = SitePool(site=variants[0].flips[0][0], kind="flip_pair", variants=variants,
                    written=written_lines is None or lines <= written_lines)
    kept = [pool for pool in pools if not pool.kind.startswith("flip_")]
    return (kept + [pair])[:MAX_SITES_PER_TEST] if len(kept) < MAX_SITES_PER_TEST else kept


def accepted_candidates(members: list[tuple[str | None, list[ast.Constant]]], nodes: list[ast.AST], k: int,
                        rng: random.Random) -> list[Variant]:
    """An accepted set's variants: one character changed alike in the same literal of every member, at a position
    where all of them agree (a dict's two orders share their rule lines and most columns), so that the members keep
    the likeness they have to one another and none of them equals any real member: a correct answer, whichever
    member it is, matches no decoy. Members of one shape only (as many literals, the changed one as long in each)."""
    if len(members) < 2 or len({len(literals) for _, literals in members}) != 1:
        return []
    index = {id(node): position for position, node in enumerate(nodes)}
    mine = {id(leaf) for _, literals in members for leaf in literals}
    inputs = "\n".join(str(node.value) for node in nodes if id(node) not in mine
                       and isinstance(node, ast.Constant) and isinstance(node.value, str | int | float))

    def whole(texts: list[str], sep: str | None) -> str:
        return texts[0] if sep is None else sep.join(texts)

    real = [whole([leaf.value for leaf in literals], sep) for sep, literals in members]
    variants: list[Variant] = []
    rows = list(range(len(members[0][1])))
    rng.shuffle(rows)
    for row in rows:
        texts = [literals[row].value for _, literals in members]
        if len({len(text) for text in texts}) != 1:
            continue
        for candidate in text_candidates(texts[0], k, rng, inputs=inputs):
            changed = literal(candidate.replacement)
            moved = [i for i, (a, b) in enumerate(zip(changed, texts[0], strict=False)) if a != b]
            if len(changed) != len(texts[0]) or not all(text[i] == texts[0][i] for text in texts for i in moved):
                continue
            new = [text[:moved[0]] + changed[moved[0]] + text[moved[0] + 1:] if moved else text for text in texts]
            after = [whole([n if i == row else leaf.value for i, leaf in enumerate(literals)], sep)
                     for n, (sep, literals) in zip(new, members, strict=True)]
            if not moved or any(text in real for text in after):
                continue
            variants.append(Variant(replacement=repr(new[0]), family=f"row{row}:{candidate.family}", also=[
                (index[id(literals[row])], repr(text)) for text, (_, literals) in zip(new, members, strict=True)]))
        if len(variants) >= MAX_VARIANTS_PER_SITE:
            break
    return variants


def bits_candidates(node: ast.List | ast.Tuple, rng: random.Random, families: int = 3) -> list[Variant]:
    """Two truth values of a list changed together: the three other combinations of the pair, one family per pair
    (k of the three are drawn: together with the real one they are any three of the four, each as likely)."""
    positions = [i for i, e in enumerate(node.elts) if isinstance(e, ast.Constant) and isinstance(e.value, bool)]
    pairs = [(i, j) for index, i in enumerate(positions) for j in positions[index + 1:]]
    variants = []
    for i, j in rng.sample(pairs, min(families, len(pairs))):
        real = (node.elts[i].value, node.elts[j].value)
        for combination in ((a, b) for a in (False, True) for b in (False, True)):
            if combination == real:
                continue
            clone = copy.deepcopy(node)
            clone.elts[i], clone.elts[j] = ast.Constant(value=combination[0]), ast.Constant(value=combination[1])
            variants.append(Variant(replacement=ast.unparse(clone), family=f"bits:{i},{j}"))
    return variants
