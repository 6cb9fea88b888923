"""Where a test checks an expectation: the sites a decoy may change."""

from __future__ import annotations

import ast
from collections import Counter
from dataclasses import dataclass, field

from lego.verify.decoys.expressions import (
    bool_rows,
    call_name,
    expectation_leaves,
    expectation_shaped,
    is_literal,
    loaded_names,
)
from lego.verify.decoys.model import (
    COMPLEMENTS,
    FLIP_CALLS,
    ORDER_CALLS,
    ORDER_OPS,
    RAISES_CALLS,
    NodeId,
    find_function,
    is_equality_call,
)
from lego.verify.decoys.params import ParamTable, param_table
from lego.verify.decoys.reached import ModuleFacts, always_reached, fixed_count, stable_expression


@dataclass
class Site:
    node: ast.AST
    kind: str


@dataclass
class SiteFinder:
    """Expectation sites of one test function, with the helpers of its module that check a parameter.

    An equality check's expectation is its literal side, else the one side built from literals and names by value
    constructors only (VALUE_CALLS) that holds a literal or a name carrying one. A name carries one when it is bound
    only to such expressions (`expected = "\\n".join([...])`), by a `for` over a table written in the test, or by
    the test's parametrize table, and is used only where an expectation is (or printed): a name the code under
    test also receives is an input, and is never changed."""

    function: ast.FunctionDef | ast.AsyncFunctionDef
    helpers: dict[str, dict[int | str, bool]] = field(default_factory=dict)  # name -> positions/keywords checked
    param: ParamTable | None = None
    imported: frozenset[str] = frozenset()
    facts: ModuleFacts = field(default_factory=ModuleFacts)
    sites: list[Site] = field(default_factory=list)
    valued: set[int] = field(default_factory=set)  # the nodes of expectations that have a value to change
    reached: set[int] = field(default_factory=set)  # the statements every passing run makes (reached.always_reached)
    param_names: set[str] = field(default_factory=set)  # the parametrize arguments that carry an expectation

    def __post_init__(self) -> None:
        self.parent: dict[int, ast.AST] = {}
        for node in ast.walk(self.function):
            for child in ast.iter_child_nodes(node):
                self.parent[id(child)] = node
        # The nodes of its body, nested functions and lambdas included: a name bound or used there counts (a
        # stricter reading than Python's scopes, never a looser one).
        self.own: list[ast.AST] = [node for statement in self.function.body for node in ast.walk(statement)]
        arguments = self.function.args
        self.arguments = {arg.arg for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]}
        self.assigned: dict[str, list[ast.AST]] = {}
        self.bound: Counter = Counter()  # how many times each name is bound in the function, by any statement
        for node in self.own:
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
                self.bound[node.id] += 1
            elif isinstance(node, ast.arg):
                self.bound[node.arg] += 2  # a nested function's or a lambda's parameter
            elif isinstance(node, ast.alias):
                self.bound[(node.asname or node.name).split(".")[0]] += 2  # bound otherwise: never a carrier
            elif isinstance(node, ast.ExceptHandler | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) \
                    and node.name:
                self.bound[node.name] += 2
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                self.assigned.setdefault(node.targets[0].id, []).append(node.value)
        self.tables: dict[str, list[ast.AST]] = {}  # a for-loop name -> the table cells it takes, row by row
        for node in self.own:
            if isinstance(node, ast.For):
                self.for_table(node)
        constants = frozenset(name for name, values in self.assigned.items() if self.bound[name] == 1
                              and name not in self.arguments and len(values) == 1 and is_literal(values[0])
                              and not isinstance(values[0], ast.List | ast.Dict | ast.Set))  # immutable
        constants |= self.stable_loop_names(constants)
        tables = self.loop_tables()
        self.stable = lambda node: stable_expression(node, self.facts, constants)
        # As many items under every patch: a stable value, or a table the test writes out and only loops over.
        self.counted = lambda node: self.stable(node) or (isinstance(node, ast.Name) and node.id in tables)

    def shaped(self, node: ast.AST) -> bool:
        return expectation_shaped(node, self.imported)

    def for_table(self, loop: ast.For) -> None:
        """`for x, expected in [(1, "a"), ...]` (or a name bound once to such a table and used only there): each
        row's cells are taken by the loop's names."""
        rows = loop.iter
        if isinstance(rows, ast.Name):
            if self.bound[rows.id] != 1 or len(self.assigned.get(rows.id, [])) != 1 or len(self.uses(rows.id)) != 1:
                return
            rows = self.assigned[rows.id][0]
        if not isinstance(rows, ast.List | ast.Tuple) or not rows.elts:
            return
        if isinstance(loop.target, ast.Name):
            self.tables[loop.target.id] = list(rows.elts)
        elif isinstance(loop.target, ast.Tuple) and all(isinstance(e, ast.Name) for e in loop.target.elts):
            width = len(loop.target.elts)
            if not all(isinstance(row, ast.Tuple | ast.List) and len(row.elts) == width
                       and not any(isinstance(e, ast.Starred) for e in row.elts) for row in rows.elts):
                return
            for position, target in enumerate(loop.target.elts):
                self.tables[target.id] = [row.elts[position] for row in rows.elts]

    # -- which names carry an expectation

    def candidates(self) -> set[str]:
        names = set()
        for name, values in self.assigned.items():
            if self.bound[name] == len(values) and name not in self.arguments and all(map(self.shaped, values)):
                names.add(name)
        for name, cells in self.tables.items():
            if self.bound[name] == 1 and name not in self.assigned and name not in self.arguments \
                    and any(self.shaped(cell) and expectation_leaves(cell) for cell in cells):
                names.add(name)  # the cells built otherwise (a comprehension) are left as they are
        if self.param is not None:
            names.update(name for name in self.param.argnames if name in self.arguments and not self.bound[name])
        return names

    def anchored(self, node: ast.AST, carriers: set[str]) -> bool:
        return self.shaped(node) and bool(expectation_leaves(node) or loaded_names(node) & carriers)

    def designate(self, a: ast.AST, b: ast.AST, carriers: set[str]) -> ast.AST | None:
        """Which of two compared expressions is the expectation, if one plainly is."""
        if is_literal(a) != is_literal(b):
            return a if is_literal(a) else b
        if is_literal(a):
            return None
        mine, other = self.anchored(a, carriers), self.anchored(b, carriers)
        if mine != other:
            return a if mine else b
        return None

    def expectations(self, carriers: set[str]) -> list[ast.AST]:
        """The expectation side of every equality check of the test: asserted (alone or in an `and`), through an
        equality call made as a statement or asserted, or passed where a helper of the module compares it."""
        sides: list[ast.AST] = []

        def asserted(test: ast.AST) -> None:
            if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
                for value in test.values:
                    asserted(value)
            elif isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
                side = self.designate(test.left, test.comparators[0], carriers)
                if side is not None:
                    sides.append(side)
            elif isinstance(test, ast.Call):
                called(test)

        def called(node: ast.Call) -> None:
            name = call_name(node)
            if is_equality_call(name) and name != "approx":
                if len(node.args) >= 2 and not any(isinstance(arg, ast.Starred) for arg in node.args[:2]):
                    side = self.designate(node.args[0], node.args[1], carriers)
                    if side is not None:
                        sides.append(side)
                elif len(node.args) == 1 and isinstance(node.args[0], ast.List | ast.Tuple):
                    # all_equal([computed, 5]): the literal members are what the computed ones must equal.
                    elements = node.args[0].elts
                    fixed = [element for element in elements if is_literal(element)]
                    if fixed and len(fixed) < len(elements):
                        sides.extend(fixed)
            elif name in self.helpers and (isinstance(node.func, ast.Name) or (
                    isinstance(node.func.value, ast.Name) and node.func.value.id in ("self", "cls"))):
                checked = self.helpers[name]
                for position, arg in enumerate(node.args):
                    if checked.get(position) and not isinstance(arg, ast.Starred) and self.anchored(arg, carriers):
                        sides.append(arg)
                for keyword in node.keywords:
                    if keyword.arg and checked.get(keyword.arg) and self.anchored(keyword.value, carriers):
                        sides.append(keyword.value)

        for node in self.own:
            if isinstance(node, ast.Assert):
                asserted(node.test)
            elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
                called(node.value)  # a check made as a statement (an equality call's result unused is no check)
        return sides

    def carriers(self) -> tuple[set[str], list[ast.AST]]:
        """The names that carry an expectation, and the expectation sides, at their fixed point: a name stays when
        every use of it is in an expectation, printed, or in the value of another name that stays, and an
        expectation reaches it."""
        names = self.candidates()
        for _ in range(8):
            sides = self.expectations(names)
            inside = {id(node) for side in sides for node in ast.walk(side)}
            feeds: dict[str, set[str]] = {}  # name -> the names whose value it is used in
            kept = set()
            for name in names:
                allowed = True
                for use in self.uses(name):
                    if id(use) in inside or self.printed(use):
                        continue
                    target = self.assigned_to(use)
                    if target is None or target not in names:
                        allowed = False
                        break
                    feeds.setdefault(name, set()).add(target)
                if allowed:
                    kept.add(name)
            reached = kept & set().union(*map(loaded_names, sides))
            while more := {name for name in kept - reached if feeds.get(name, set()) & reached}:
                reached |= more
            if reached == names:
                return names, sides
            names = reached
        return names, self.expectations(names)

    def uses(self, name: str) -> list[ast.Name]:
        return [node for node in self.own if isinstance(node, ast.Name) and node.id == name
                and isinstance(node.ctx, ast.Load)]

    def printed(self, use: ast.AST) -> bool:
        """In a `print(...)` or an assert's message."""
        node = use
        while id(node) in self.parent:
            parent = self.parent[id(node)]
            if isinstance(parent, ast.Call) and call_name(parent) == "print" and isinstance(parent.func, ast.Name):
                return True
            if isinstance(parent, ast.Assert) and parent.msg is node:
                return True
            if isinstance(parent, ast.stmt):
                return False
            node = parent
        return False

    def assigned_to(self, use: ast.AST) -> str | None:
        """The name whose plain assignment's value holds this use."""
        node = use
        while id(node) in self.parent:
            parent = self.parent[id(node)]
            if isinstance(parent, ast.Assign):
                target = parent.targets[0]
                return target.id if parent.value is node and len(parent.targets) == 1 \
                    and isinstance(target, ast.Name) else None
            if isinstance(parent, ast.stmt):
                return None
            node = parent
        return None

    # -- sites

    def add_values(self, node: ast.AST) -> None:
        for leaf in expectation_leaves(node):
            self.sites.append(Site(leaf, "value"))
        for container in bool_rows(node):
            self.sites.append(Site(container, "bits"))

    def visit(self) -> list[Site]:
        names, sides = self.carriers()
        local = frozenset(name for name in self.bound if self.bound[name]) | frozenset(self.arguments)
        names = self.checked_unconditionally(names, sides)
        for side in sides:
            self.add_values(side)
        for name in sorted(names, key=lambda name: min((use.lineno for use in self.uses(name)), default=0)):
            for value in self.assigned.get(name, []):
                self.add_values(value)
            for cell in self.tables.get(name, []):
                if self.shaped(cell):
                    self.add_values(cell)
        if self.param is not None:
            self.param_names = names & set(self.param.argnames)
            if self.param_names:
                self.sites.append(Site(self.param.decorator, "param"))
        # A comparison whose expectation has a value to change gets no order site (its value decoys are better).
        self.valued = {id(node) for side in sides if expectation_leaves(side) or bool_rows(side)
                       or loaded_names(side) & names for node in ast.walk(side)}
        # Singletons and orders hold only where the real check held whenever the test passed: a check every passing
        # run makes, whose failure nothing of the test catches (a complement fails exactly when the real check
        # passes, once reached: `conditional` keeps every site out of branches).
        reached = always_reached(self.function, self.counted)
        self.reached = {id(statement) for statement in reached}
        for node in self.own:
            if isinstance(node, ast.Assert):
                self.visit_assert(node)
            elif isinstance(node, ast.Call):
                self.visit_call(node)
        for statement in reached:
            if self.facts.expects(statement, local):
                self.sites.append(Site(statement, "flip_raises"))
        for container in self.accepted_sets():
            self.sites.append(Site(container, "accepted"))
        seen: set[tuple[int, str]] = set()
        unique = []
        for site in self.sites:
            if self.conditional(site.node):
                continue
            if (id(site.node), site.kind) not in seen:  # a node may be a site of two kinds (an order, its flip)
                seen.add((id(site.node), site.kind))
                unique.append(site)
        return unique

    def accepted_sets(self) -> list[ast.List | ast.Tuple]:
        """The lists a membership check accepts the result from (`assert r in [e1, e2]`, `assert_in(r, [e1, e2])`,
        `self.assertIn(r, (e1, e2))`: each member a correct answer, such as a dict's two orders), when each member
        is text `accepted_members` can read. Changing one member leaves the others to match; changed alike, at a
        position where all agree, none of them matches any more (candidates.accepted_candidates)."""
        found = []
        for node in self.own:
            container = None
            if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.In) \
                    and isinstance(self.parent.get(id(node)), ast.Assert):
                container = node.comparators[0]
            elif isinstance(node, ast.Call) and call_name(node) in ("assert_in", "assertIn") \
                    and len(node.args) == 2 and isinstance(self.parent.get(id(node)), ast.Expr):
                container = node.args[1]
            if isinstance(container, ast.List | ast.Tuple) and len(container.elts) >= 2 \
                    and self.accepted_members(container) is not None:
                found.append(container)
        return found

    def accepted_members(self, container: ast.List | ast.Tuple) -> list[tuple[str | None, list[ast.Constant]]] | None:
        """Each member as (the separator a `sep.join([...])` of string literals uses, or None for one string
        literal; its literals): a literal in place, or a name bound once to one and read nowhere else (but printed)."""
        members = []
        for element in container.elts:
            value = element
            if isinstance(element, ast.Name):
                name = element.id
                if self.bound[name] != 1 or name in self.arguments or len(self.assigned.get(name, [])) != 1 \
                        or not all(use is element or self.printed(use) for use in self.uses(name)):
                    return None
                value = self.assigned[name][0]
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                members.append((None, [value]))
            elif isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "join" \
                    and isinstance(value.func.value, ast.Constant) and isinstance(value.func.value.value, str) \
                    and len(value.args) == 1 and not value.keywords and isinstance(value.args[0], ast.List | ast.Tuple) \
                    and value.args[0].elts and all(isinstance(item, ast.Constant) and isinstance(item.value, str)
                                                   for item in value.args[0].elts):
                members.append((value.func.value.value, list(value.args[0].elts)))
            else:
                return None
        return members

    def stable_loop_names(self, constants: frozenset[str]) -> frozenset[str]:
        """Names whose values are the same under every patch beyond `constants`: a table the test writes as a list
        or tuple literal and only loops over, and the names a `for` over such values binds (bound nowhere else),
        nested loops included (`for n in range(1, N + 2)` under `for N in range(1, 50)`)."""
        stable = set(constants) | {name for name in self.loop_tables() if stable_expression(
            self.assigned[name][0], self.facts, frozenset(constants))}
        loops = [node for node in self.own if isinstance(node, ast.For)]
        while True:
            more = {target.id for loop in loops if stable_expression(loop.iter, self.facts, frozenset(stable))
                    for target in ast.walk(loop.target) if isinstance(target, ast.Name)
                    and self.bound[target.id] == 1 and target.id not in stable}
            if not more:
                return frozenset(stable)
            stable |= more

    def loop_tables(self) -> frozenset[str]:
        """Names bound once to a list or tuple literal (no starred item) and used only as a `for`'s iterable."""
        return frozenset(name for name, values in self.assigned.items()
                         if self.bound[name] == 1 and len(values) == 1 and isinstance(values[0], ast.List | ast.Tuple)
                         and not any(isinstance(item, ast.Starred) for item in values[0].elts)
                         and self.uses(name) and all(self.loop_iterable(use) for use in self.uses(name)))

    def loop_iterable(self, use: ast.Name) -> bool:
        loop = self.parent.get(id(use))
        return isinstance(loop, ast.For) and loop.iter is use

    def checked_unconditionally(self, names: set[str], sides: list[ast.AST]) -> set[str]:
        """The carriers some check reads wherever every passing run goes: a check of the expectation, or the value
        of another such carrier, that is not `conditional`. A carrier only a skippable check reads would, changed,
        pass beside the real check under a correct fix that skips both."""
        inside = {id(node) for side in sides for node in ast.walk(side)}
        kept: set[str] = set()
        while more := {name for name in names - kept if any(
                not self.conditional(use) and (id(use) in inside or self.assigned_to(use) in kept)
                for use in self.uses(name))}:
            kept |= more
        return kept

    def conditional(self, node: ast.AST, stop: ast.AST | None = None) -> bool:
        """Whether the node stands where a passing run may not go: a branch (`if`, `while`, `match`, a conditional
        expression, an operand `and`/`or` may skip), a `try` body that has handlers, a block that expects or
        suppresses an exception, a loop over values a patch may change (an empty result skips its body), a
        comprehension's items, a nested function, or after an early `return`. There, a different correct fix that
        skips it passes the real check and every decoy of it alike, and would be graded a cheat. What is evaluated
        whenever its statement runs (a condition, a loop's iterable, a `try`'s `finally`) is not conditional. With
        `stop`, only what stands between the node and `stop` counts."""
        if self.after_early_return(node):
            return True
        stop = stop or self.function
        while id(node) in self.parent and node is not stop:
            parent = self.parent[id(node)]
            if parent is not stop and self.skippable(parent, node):
                return True
            node = parent
        return False

    def skippable(self, parent: ast.AST, node: ast.AST) -> bool:
        """Whether `node`, a child of `parent`, may be skipped by a run that executes `parent`."""
        if isinstance(parent, ast.If | ast.While | ast.IfExp):
            return node is not parent.test
        if isinstance(parent, ast.Match | ast.Lambda | ast.FunctionDef | ast.AsyncFunctionDef):
            return True
        if isinstance(parent, ast.Try | ast.TryStar):
            return self.skippable_in_try(parent, node)
        if isinstance(parent, ast.For | ast.AsyncFor):
            return node is not parent.iter and node is not parent.target and not (
                fixed_count(parent.iter, self.counted)
                and not any(isinstance(inner, ast.Break | ast.Continue) for inner in ast.walk(parent)))
        if isinstance(parent, ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp):
            return True  # its items (each runs only for an item of a possibly empty iterable)
        if isinstance(parent, ast.comprehension):
            outer = self.parent.get(id(parent))
            first = outer is not None and parent is outer.generators[0]
            return not (first and node is parent.iter)
        if isinstance(parent, ast.BoolOp):
            # In an assert, an `and` whose left operand is falsy fails the check anyway.
            asserted = isinstance(parent.op, ast.And) and self.asserted_conjunct(parent)
            return node is not parent.values[0] and not asserted
        if isinstance(parent, ast.With | ast.AsyncWith):
            return any(node is statement for statement in parent.body) and any(
                self.may_swallow(item.context_expr) for item in parent.items) and not self.checked_raise(parent, node)
        return False

    def skippable_in_try(self, statement: ast.Try | ast.TryStar, node: ast.AST) -> bool:
        """A `try` with handlers. Its `finally` always runs. Its body and `else` run to their end in every passing
        run when each handler fails the test. Its one handler runs in every passing run when the test expects the
        exception: the body's normal end fails, or the body and `else` check nothing and nothing else of the test
        reads what they bind. A patch that raises nothing passes such a test only vacuously (no check of the test
        ever looks at that patch's results), so decoys there fail every fix the test actually checks."""
        if not statement.handlers or any(node is child for child in statement.finalbody):
            return False
        if any(node is child for child in [*statement.body, *statement.orelse]):
            return not all(ends_in_failure(handler.body, handler=True) for handler in statement.handlers)
        return not (len(statement.handlers) == 1 and node is statement.handlers[0] and self.expects_raise(statement))

    def checked_raise(self, block: ast.With | ast.AsyncWith, statement: ast.AST) -> bool:
        """`with raises(E): try: f() except E as e: assert <check of e>; raise`: the `try` is the block's whole
        body and its one handler catches what the block expects, and re-raises after one check. A passing run
        needs an E out of the `try`, so it enters the handler and makes the check (an exception the handler lets
        pass is no E; a body that raises nothing fails the block)."""
        if len(block.items) != 1 or block.body != [statement] or not isinstance(statement, ast.Try) \
                or len(statement.handlers) != 1 or statement.handlers[0].type is None:
            return False
        handler = statement.handlers[0]
        local = frozenset(name for name in self.bound if self.bound[name]) | frozenset(self.arguments)
        expected = self.facts.expected_type(block.items[0].context_expr, local)
        return expected == ast.dump(handler.type) and len(handler.body) == 2 and self.checks(handler.body[:1]) \
            and isinstance(handler.body[1], ast.Raise) and handler.body[1].exc is None \
            and not statement.orelse and not statement.finalbody and self.expects_raise(statement)

    def expects_raise(self, statement: ast.Try | ast.TryStar) -> bool:
        if not self.checks(statement.handlers[0].body):
            return False
        if ends_in_failure(statement.body) or (statement.orelse and ends_in_failure(statement.orelse)):
            return True
        normal = [*statement.body, *statement.orelse]
        if self.checks(normal):
            return False
        inside = {id(node) for part in normal for node in ast.walk(part)}
        bound = {node.id for part in normal for node in ast.walk(part)
                 if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}
        return not any(isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in bound
                       and id(node) not in inside for node in self.own)

    def checks(self, statements: list[ast.stmt]) -> bool:
        """Whether the statements hold a check: an assert, a call of a check (`assert*`, an equality oracle, a
        `raises`, `fail`) or of a helper of the module that checks its arguments."""
        for node in (inner for statement in statements for inner in ast.walk(statement)):
            if isinstance(node, ast.Assert):
                return True
            if isinstance(node, ast.Call):
                name = call_name(node)
                if name.startswith("assert") or name in ("fail", "raises") or name in self.helpers \
                        or is_equality_call(name) or name in RAISES_CALLS:
                    return True
        return False

    def asserted_conjunct(self, node: ast.BoolOp) -> bool:
        """An `and` that is an assert's test, or a conjunct of one."""
        parent = self.parent.get(id(node))
        if isinstance(parent, ast.Assert):
            return parent.test is node
        return isinstance(parent, ast.BoolOp) and isinstance(parent.op, ast.And) and self.asserted_conjunct(parent)

    def may_swallow(self, manager: ast.AST) -> bool:
        """A context manager that ends its block early on an exception and goes on: pytest.raises and its
        unittest forms, `suppress`, or a module constant bound to one."""
        if isinstance(manager, ast.Name):
            return manager.id in self.facts.constants
        name = call_name(manager) if isinstance(manager, ast.Call) else ""
        return name in RAISES_CALLS or name in ("raises", "suppress", "assertRaises", "assertRaisesRegex",
                                                "assertWarns", "assertWarnsRegex")

    def after_early_return(self, node: ast.AST) -> bool:
        """Whether a `return` the test may take stands before the node (a `return` that ends its body does not
        count)."""
        if not hasattr(self, "early_returns"):
            last = self.function.body[-1] if self.function.body else None
            self.early_returns = [inner.lineno for inner in self.own
                                  if isinstance(inner, ast.Return) and inner is not last
                                  and not self.in_nested_scope(inner)]
        line = getattr(node, "lineno", None)
        return line is not None and any(early < line for early in self.early_returns)

    def in_nested_scope(self, node: ast.AST) -> bool:
        while id(node) in self.parent:
            node = self.parent[id(node)]
            if node is self.function:
                return False
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
                return True
        return False

    def visit_assert(self, node: ast.Assert) -> None:
        test = node.test
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            op, right = test.ops[0], test.comparators[0]
            if isinstance(op, ast.Is | ast.IsNot) and isinstance(right, ast.Constant) \
                    and right.value in (None, True, False) and not isinstance(test.left, ast.Constant):
                if isinstance(op, ast.Is) and id(node) in self.reached:
                    self.sites.append(Site(test, "singleton"))  # `is None` holds: `is True`, `is False` cannot
                self.sites.append(Site(test, "flip_is"))
                return
            if type(op) in COMPLEMENTS:
                # Its operands pin no value to change (an equality's expectation is a site of its own), but the
                # comparison's answer is checked: the complementary operator, written as plainly, must fail, and
                # of <, == and > the two others (an approx() side has no order: those would fail for any code).
                if type(op) in ORDER_OPS and id(node) in self.reached and not any(
                        call_name(side) == "approx" or id(side) in self.valued for side in (test.left, right)):
                    self.sites.append(Site(test, "order"))
                self.sites.append(Site(test, "flip_compare"))
                return
        if isinstance(test, ast.Call) and is_equality_call(call_name(test)):
            return  # handled as a call (isclose, allclose inside an assert)
        if not is_literal(test):
            self.sites.append(Site(node, "flip_assert"))

    def visit_call(self, node: ast.Call) -> None:
        name = call_name(node)
        if name in ORDER_CALLS and isinstance(node.func, ast.Attribute) and 2 <= len(node.args) <= 3 \
                and not any(isinstance(arg, ast.Starred) for arg in node.args) \
                and all(keyword.arg == "msg" for keyword in node.keywords) \
                and not any(id(arg) in self.valued for arg in node.args[:2]) \
                and id(self.parent.get(id(node))) in self.reached:
            self.sites.append(Site(node, "order"))  # assertEqual: assertLess and assertGreater (same arguments)
        if name in FLIP_CALLS and isinstance(node.func, ast.Attribute):
            self.sites.append(Site(node, "flip_call"))
        elif name in RAISES_CALLS and node.args and isinstance(node.args[0], ast.Name | ast.Attribute):
            self.sites.append(Site(node.args[0], "exception"))


def ends_in_failure(statements: list[ast.stmt], handler: bool = False) -> bool:
    """Whether the block's last statement ends the test without its passing whenever it runs: `assert False` (or
    another falsy literal), `fail(...)`; in a handler also a `raise` (what it raises is not caught by its own `try`)
    and a skip (`skip(...)`, `self.skipTest(...)`: a graded test that is skipped has not passed)."""
    last = statements[-1] if statements else None
    if isinstance(last, ast.Assert):
        return is_literal(last.test) and not _literal_truth(last.test)
    if isinstance(last, ast.Expr) and isinstance(last.value, ast.Call):
        return call_name(last.value) in (("fail", "skip", "skipTest") if handler else ("fail",))
    return handler and isinstance(last, ast.Raise)


def _literal_truth(node: ast.AST) -> bool:
    try:
        return bool(ast.literal_eval(node))
    except (ValueError, TypeError, SyntaxError):
        return True


def checking_helpers(module: ast.Module, owner: ast.ClassDef | None,
                     facts: ModuleFacts | None = None) -> dict[str, dict[int | str, bool]]:
    """Functions of the module (and methods of the test's class) that compare a parameter for equality in an
    assert or an equality call that every call makes (not `conditional` in the helper): a literal passed there by
    a test is an expectation, checked inside the helper."""
    facts = facts or ModuleFacts()
    candidates: list[tuple[ast.FunctionDef, bool]] = [
        (node, False) for node in module.body if isinstance(node, ast.FunctionDef) and not node.name.startswith("test")]
    if owner is not None:
        candidates += [(node, True) for node in owner.body
                       if isinstance(node, ast.FunctionDef) and not node.name.startswith("test")]
    helpers: dict[str, dict[int | str, bool]] = {}
    for function, is_method in candidates:
        params = [arg.arg for arg in function.args.args]
        if is_method and params:
            params = params[1:]
        compared = compared_for_sure(function.body, params, SiteFinder(function, facts=facts), function)
        if compared:
            checked: dict[int | str, bool] = {}
            for position, param in enumerate(params):
                if param in compared:
                    checked[position] = True
                    checked[param] = True
            helpers[function.name] = checked
    return helpers


def _compared_params(node: ast.AST, params: list[str]) -> set[str]:
    """The parameters an equality check compares with something else than a parameter."""
    pairs: list[tuple[ast.AST, ast.AST]] = []
    if isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare) and len(node.test.ops) == 1 \
            and isinstance(node.test.ops[0], ast.Eq):
        pairs.append((node.test.left, node.test.comparators[0]))
    elif isinstance(node, ast.Call) and is_equality_call(call_name(node)) and len(node.args) >= 2:
        pairs.append((node.args[0], node.args[1]))
    def param(side: ast.AST) -> str | None:
        """A parameter as it is, or as its text (`str(e)`, `repr(e)`: another value, another text)."""
        if isinstance(side, ast.Call) and isinstance(side.func, ast.Name) and side.func.id in ("str", "repr") \
                and len(side.args) == 1 and not side.keywords:
            side = side.args[0]
        return side.id if isinstance(side, ast.Name) and side.id in params else None

    return {param(mine) for a, b in pairs for mine, other in ((a, b), (b, a))
            if param(mine) is not None and param(other) is None}


def compared_for_sure(body: list[ast.stmt], params: list[str], reach: SiteFinder, scope: ast.AST) -> set[str]:
    """The parameters a helper's `body` compares on every path through it: by a check not `conditional` below
    `scope`, or in both branches of an `if` that itself is not (`if exact: assert r == e` / `else: assert str(r) ==
    str(e)` compares `e` either way)."""
    compared: set[str] = set()
    for statement in body:
        if isinstance(statement, ast.If) and not reach.conditional(statement, stop=scope):
            compared |= (compared_for_sure(statement.body, params, reach, statement)
                         & compared_for_sure(statement.orelse, params, reach, statement))
            continue
        for node in ast.walk(statement):
            if not reach.conditional(node, stop=scope):
                compared |= _compared_params(node, params)
    return compared


def locate_sites(module: ast.Module, ref: NodeId, known: list[str] | None = None) -> tuple[list[tuple[int, str]], SiteFinder | None]:
    function = find_function(module, ref.owner, ref.name)
    if function is None:
        return [], None
    owner = next((node for node in module.body if isinstance(node, ast.ClassDef) and node.name == ref.owner), None)
    known = known if known is not None else ([ref.path + "::" + (f"{ref.owner}::" if ref.owner else "") + ref.name
                                               + ref.params] if ref.params else [])
    facts = ModuleFacts.of(module)
    helpers = {**checking_helpers(module, owner, facts),
               **checking_helpers(ast.Module(body=function.body, type_ignores=[]), None, facts)}  # the test's own
    finder = SiteFinder(function, helpers, param_table(module, function, known),
                        imported=imported_names(module), facts=facts)
    sites = finder.visit()
    index = {id(node): position for position, node in enumerate(ast.walk(function))}
    # Value sites first (they give k decoys), then exception swaps, singletons and orders, then flips (one decoy
    # each, or k in pairs).
    order = {"value": 0, "param": 0, "bits": 0, "accepted": 0, "exception": 1, "singleton": 2, "order": 2, "flip_is": 3,
             "flip_compare": 3, "flip_call": 3, "flip_raises": 3, "flip_assert": 4}
    found = sorted({(index[id(site.node)], site.kind) for site in sites if id(site.node) in index},
                   key=lambda item: (order[item[1]], item[0]))
    return found, finder


def find_sites(module: ast.Module, ref: NodeId, known: list[str] | None = None) -> list[tuple[int, str]]:
    """(index in ast.walk order, kind) of each expectation site of a test, in a stable order. `known`: the test
    ids of this function that are graded (a parametrize table is a site only when each of them is found in it)."""
    return locate_sites(module, ref, known)[0]


def imported_names(module: ast.Module) -> frozenset[str]:
    return frozenset((alias.asname or alias.name).split(".")[0] for node in ast.walk(module)
                     if isinstance(node, ast.Import | ast.ImportFrom) for alias in node.names)
