"""Decoy site finding, candidates, drawing and layouts (lego/verify/decoys/), without Docker or pytest runs.

Site finding: each shape of checked expectation a test can have gives its site (a literal compared, a value built
by constructors, a name bound to one, a loop's or a parametrize table's expected column, truth values, helpers,
flipped truths, exceptions), and inputs never do. Layouts: the real test and its decoys differ only at the site,
under fresh names, in a shuffled order, all printed alike; graded names never appear in the files written.
"""

from __future__ import annotations

import ast
import difflib
import os
import random
import re
import subprocess
import sys
from collections import Counter

import pytest

from lego.verify.decoys import (
    DecoyPlan,
    DecoysOfTest,
    NodeId,
    build_layout,
    plan_candidates,
    validation_layout,
)
from lego.verify.decoys.candidates import number_candidates
from lego.verify.decoys.model import SitePool, Variant, draw_variants, find_function
from lego.verify.decoys.params import param_table
from lego.verify.decoys.sites import find_sites

PATH = "tests/test_mod.py"
NAME = re.compile(r"test_[0-9a-f]{12}")


def sites(source: str, test: str, known: list[str] | None = None) -> list[tuple[str, str]]:
    """(kind, the node's source) of each site of `test`, in find_sites' order."""
    module = ast.parse(source)
    ref = NodeId.parse(f"{PATH}::{test}")
    nodes = list(ast.walk(find_function(module, ref.owner, ref.name)))
    ids = [f"{PATH}::{item}" for item in known] if known is not None else None
    return [(kind, ast.unparse(nodes[index])) for index, kind in find_sites(module, ref, ids)]


def values(source: str, test: str, known: list[str] | None = None) -> list[str]:
    """The value sites' literals, sorted (their order is the AST's, not the source's)."""
    return sorted(text for kind, text in sites(source, test, known) if kind == "value")


def plan_of(source: str, tests: list[str], seed: int = 0) -> DecoyPlan:
    """Every candidate taken as validated (as if each had failed under the gold patch)."""
    ids = [f"{PATH}::{test}" for test in tests]
    return DecoyPlan(tests=plan_candidates(source, ids, 2, random.Random(seed)))


def layout_of(source: str, tests: list[str], seed: int, plan: DecoyPlan | None = None):
    ids = [f"{PATH}::{test}" for test in tests]
    return build_layout({PATH: source}, plan or plan_of(source, tests), ids, [], k=2, pass_to_pass_sample=0,
                        rng=random.Random(seed))


def group_functions(text: str, owner: str | None = None) -> dict[str, str]:
    """Each rendered test function of a layout's file, by name, as printed source."""
    module = ast.parse(text)
    body = module.body
    if owner:
        body = next(node for node in module.body if isinstance(node, ast.ClassDef) and node.name == owner).body
    return {node.name: ast.unparse(node) for node in body
            if isinstance(node, ast.FunctionDef) and NAME.fullmatch(node.name)}


# ---------------------------------------------------------------------------------------------- site finding


def test_a_compared_literal_is_a_site_and_the_code_under_tests_arguments_are_not():
    source = "def test_add():\n    assert add(2, 3) == 5\n    assert 'ab' == join('a', 'b')\n"
    assert values(source, "test_add") == ["'ab'", "5"]


def test_constructor_arguments_of_the_expected_value_are_sites():
    source = ("def test_parse():\n"
              "    assert parse_quantity('-40 degC') == Quantity(-40.0, 'degC')\n"
              "    assert month_end(date(2024, 12, 5)) == date(2024, 12, 31)\n"
              "    assert left.intersection(right) == Interval.closed(1, 1)\n")
    found = values(source, "test_parse")
    assert {"-40.0", "'degC'", "2024", "12", "31", "1"} <= set(found)
    assert "'-40 degC'" not in found and "5" not in found  # inputs of the code under test


def test_two_constructed_sides_are_ambiguous_and_give_no_value_site():
    source = "def test_same():\n    assert Version('1.0') == Version.parse('1.0')\n"
    assert values(source, "test_same") == []


def test_str_of_a_result_compared_with_a_literal():
    source = "def test_str():\n    assert str(Foo(1)) == 'Foo(1)'\n    assert repr(x) == 'X'\n"
    assert values(source, "test_str") == ["'Foo(1)'", "'X'"]


def test_a_name_bound_to_a_joined_literal_is_an_expectation():
    source = ("def test_table():\n"
              "    result = tabulate(rows)\n"
              "    expected = '\\n'.join(['a  b', '-  -', '1  2'])\n"
              "    print(f'expected: {expected!r}')\n"
              "    assert_equal(expected, result)\n")
    assert values(source, "test_table") == ["'1  2'", "'a  b'"]  # '-  -' has nothing to change


def test_a_name_rebound_through_a_value_constructor_keeps_its_literals():
    source = ("def test_wrap():\n"
              "    expected = ['+---+', '| a |']\n"
              "    expected = '\\n'.join(expected)\n"
              "    assert_equal(expected, tabulate(data))\n")
    assert values(source, "test_wrap") == ["'| a |'"]


def test_a_name_the_code_under_test_also_receives_is_an_input():
    source = ("def test_identity():\n"
              "    x = 5\n"
              "    assert f(x) == x\n"
              "    expected = 'abc'\n"
              "    assert g(expected) == expected\n")
    assert values(source, "test_identity") == []


def test_numpy_array_expectations():
    source = ("import numpy as np\n\n\n"
              "def test_np():\n"
              "    np.testing.assert_array_equal(compute(a), np.array([1, 2, 3]))\n"
              "    assert np.array_equal(compute(b), [4.5, 6])\n"
              "    assert compute(c).tolist() == [[7]]\n")
    assert values(source, "test_np") == ["1", "2", "3", "4.5", "6", "7"]


def test_tolerances_and_dtypes_are_settings_not_expectations():
    source = ("def test_close():\n"
              "    assert area(r) == pytest.approx(3.14, rel=1e-3)\n"
              "    np.testing.assert_allclose(v, np.array([0.5], dtype='float32'), rtol=0.01)\n")
    assert values(source, "test_close") == ["0.5", "3.14"]


def test_each_conjunct_of_an_asserted_and_is_checked():
    source = "def test_both():\n    assert d['k'] == 2 and d['l'] == [4, 5]\n"
    assert values(source, "test_both") == ["2", "4", "5"]


def test_a_loop_over_a_table_written_in_the_test():
    source = ("def test_len():\n"
              "    for args, expected in [((1, 7, 2), 4), ((0, 3, 1), 3)]:\n"
              "        with subTest(args=args):\n"
              "            assert len(numeric_range(*args)) == expected\n")
    assert values(source, "test_len") == ["3", "4"]  # the arguments' column is the input


def test_a_parametrized_expected_column_is_one_site_and_the_input_column_none():
    source = ("import pytest\n\nCASES = (('box', 'boxes'), ('wife', 'wives'))\n\n\n"
              "@pytest.mark.parametrize(('singular', 'plural'), CASES)\n"
              "def test_plural(singular, plural):\n"
              "    assert plural == pluralize(singular)\n"
              "    assert plural.capitalize() == pluralize(singular.capitalize())\n")
    known = ["test_plural[box-boxes]", "test_plural[wife-wives]"]
    assert [kind for kind, _ in sites(source, "test_plural", known)] == ["param", "flip_compare", "flip_compare"]
    identity = source.replace("assert plural == pluralize(singular)", "assert plural == pluralize(plural)")
    assert "param" not in [kind for kind, _ in sites(identity, "test_plural", known)]


def test_a_parametrize_table_is_a_site_only_where_every_graded_id_is_found_in_it():
    source = ("@pytest.mark.parametrize('n, expected', [(1, '1st'), (2, '2nd')])\n"
              "def test_ordinal(n, expected):\n    assert ordinal(n) == expected\n")
    module = ast.parse(source)
    function = find_function(module, None, "test_ordinal")
    table = param_table(module, function, [f"{PATH}::test_ordinal[1-1st]"])
    assert table is not None and table.ids == ["1-1st", "2-2nd"]
    assert param_table(module, function, [f"{PATH}::test_ordinal[1-1st-fixture0]"]) is None  # a fixture's params
    escaped = source.replace("'2nd'", "'2\\xe9'")
    assert param_table(ast.parse(escaped), find_function(ast.parse(escaped), None, "test_ordinal"),
                       [f"{PATH}::test_ordinal[2-2\\xe9]"]) is not None  # pytest's escaping reproduced


def test_truth_values_of_an_expectation_are_changed_in_pairs():
    source = "def test_flags():\n    assert [cfg.getbool(k) for k in 'abcd'] == [True, False, True, False]\n"
    assert ("bits", "[True, False, True, False]") in sites(source, "test_flags")
    plan = plan_of(source, ["test_flags"])
    pool = next(p for p in plan.tests[f"{PATH}::test_flags"].pools if p.kind == "bits")
    for family in {v.family for v in pool.variants}:
        members = [v.replacement for v in pool.variants if v.family == family]
        assert len(members) == 3 and "[True, False, True, False]" not in members


def test_helpers_that_compare_a_parameter_module_level_and_nested():
    source = ("def check(text, expected):\n    assert render(text) == expected\n\n\n"
              "def test_render():\n"
              "    check('a', 'A!')\n"
              "    def y(fmt, s, e):\n"
              "        r = parse(fmt, s)\n"
              "        assert r == e\n"
              "    y('{:d}', 'a 12 b', 12)\n")
    assert values(source, "test_render") == ["'A!'", "12"]
    # A helper whose comparison a call may skip (it checks only when something is found) checks nothing for sure.
    skipping = ("def check(text, expected):\n    found = render(text)\n    if found:\n"
                "        assert found == expected\n\n\n"
                "def test_render():\n    check('a', 'A!')\n")
    assert values(skipping, "test_render") == []
    # Compared in both branches of an `if`: compared either way.
    either = ("def check(text, expected, exact=True):\n    found = render(text)\n    if exact:\n"
              "        assert found == expected\n    else:\n        assert str(found) == str(expected)\n\n\n"
              "def test_render():\n    check('a', 'A!')\n")
    assert values(either, "test_render") == ["'A!'"]


def test_flips_and_exceptions():
    source = ("def test_misc(self):\n"
              "    assert r is None\n"
              "    assert (x in s) != (x in t)\n"
              "    assert ok()\n"
              "    self.assertTrue(done)\n"
              "    with pytest.raises(ValueError):\n"
              "        parse('x')\n")
    kinds = [kind for kind, _ in sites(source, "test_misc")]
    assert kinds == ["exception", "singleton", "flip_is", "flip_compare", "flip_call", "flip_assert"]


def test_a_string_of_punctuation_only_is_a_site_where_it_mixes_marks():
    source = ("def test_pattern():\n"
              "    assert compile_format('{}') == r'(.+?)'\n"
              "    assert rule(3) == '+---+'\n")
    assert values(source, "test_pattern") == ["'(.+?)'"]  # a rule of one or two marks is read at a glance
    plan = plan_of(source, ["test_pattern"])
    pool = next(p for p in plan.tests[f"{PATH}::test_pattern"].pools if p.kind == "value")
    for variant in pool.variants:
        changed = ast.literal_eval(variant.replacement)
        if variant.family.startswith("pos:"):
            assert len(changed) == 5 and sum(a != b for a, b in zip(changed, "(.+?)", strict=True)) == 1
            assert not any(c.isalnum() or c in "\\'\"" for c in changed)


def test_two_truth_checks_are_flipped_in_pairs_where_a_test_has_no_value_to_change():
    source = ("def test_none():\n"
              "    assert parse('{:d}', 'abc') is not None\n"
              "    assert valid(schema, {'a': 1})\n"
              "    assert not done\n")
    found = plan_of(source, ["test_none"]).tests[f"{PATH}::test_none"]
    assert [pool.kind for pool in found.pools] == ["flip_pair"] and found.available(2) == 2
    pool = found.pools[0]
    for family in {v.family for v in pool.variants}:
        flips = [v.flips for v in pool.variants if v.family == family]
        assert len(flips) == 3 and len({index for flip in flips for index, _ in flip}) == 2
    layout = layout_of(source, ["test_none"], seed=1, plan=DecoyPlan(tests={f"{PATH}::test_none": found}))
    functions = group_functions(layout.files[PATH])
    real = layout.real[f"{PATH}::test_none"].split("::")[-1]
    real_lines = functions[real].replace(real, "NAME").splitlines()
    assert len(layout.decoys) == 2
    for decoy in layout.decoys:
        name = decoy.split("::")[-1]
        lines = functions[name].replace(name, "NAME").splitlines()
        changed = [a for a, b in zip(real_lines, lines, strict=True) if a != b]
        assert 1 <= len(changed) <= 2 and all(line.strip().startswith("assert") for line in changed)
    # A test with a value to change keeps it, and pairs its flips beside it.
    valued = source + "    assert total() == 42\n"
    kinds = [pool.kind for pool in plan_of(valued, ["test_none"]).tests[f"{PATH}::test_none"].pools]
    assert kinds == ["value", "flip_pair"]


RAISING = """import unittest
import pytest
from pytest import raises

SE = raises(KeyError)
BROAD = raises(SystemExit)


def expect(error):  # a manager of the module's own: it might pass a block that raises nothing
    return raises(error)


def test_dropped(self):
    with pytest.raises(ValueError):
        parse('x')
    with raises(KeyError, match='k'):
        lookup('k')
    with SE:
        lookup('k')
    for word in ['a', 'b']:
        with pytest.raises(ValueError) as info:
            parse(word)
    with self.assertRaisesRegex(ValueError, 'bad'):
        parse('y')


def test_kept(self, error):
    try:
        with pytest.raises(ValueError):
            parse('x')
    except Exception:
        pass
    if ready():
        with pytest.raises(ValueError):
            parse('x')
    with self.subTest():
        with self.assertRaises(ValueError):
            parse('x')
    with pytest.raises(ValueError), open('f'):
        parse('x')
    for word in words():
        with pytest.raises(ValueError):
            parse(word)
    for word in ['a', 'b']:
        if word == 'b':
            continue
        with pytest.raises(ValueError):
            parse(word)
    with expect(ValueError):
        parse('x')
    with pytest.raises(pytest.skip.Exception):
        parse('x')
    with BROAD:
        parse('x')
    with pytest.raises(error):
        parse('x')
    pytest.raises(ValueError, parse, 'x')

    def inner():
        with pytest.raises(ValueError):
            parse('x')


def test_shadowed():
    SE = make()
    with SE:
        lookup('k')


def test_returns_early():
    if skip_it():
        return
    with pytest.raises(ValueError):
        parse('x')
"""


def test_an_expected_exception_block_is_a_site_only_where_every_passing_run_lets_its_exception_out():
    dropped = [text.splitlines()[0] for kind, text in sites(RAISING, "test_dropped") if kind == "flip_raises"]
    assert sorted(dropped) == sorted(["with pytest.raises(ValueError):", "with raises(KeyError, match='k'):",
                                      "with SE:", "with self.assertRaisesRegex(ValueError, 'bad'):",
                                      "with pytest.raises(ValueError) as info:"])
    for test in ("test_kept", "test_shadowed", "test_returns_early"):
        assert "flip_raises" not in [kind for kind, _ in sites(RAISING, test)], test


def test_a_check_in_the_handler_a_raises_block_needs_is_a_site_and_the_block_is_still_dropped():
    """The `try` is the block's whole body, its one handler catches what the block expects and re-raises after its
    check: a passing run needs that exception out of the `try`, so it makes the check. Where the handler catches
    another type (an exception it lets pass may still satisfy the block), the check is left alone."""
    source = ("import pytest\n\n\ndef test_message():\n"
              "    with pytest.raises(ValueError):\n"
              "        try:\n"
              "            parse('x')\n"
              "        except ValueError as error:\n"
              "            assert 'bad' in str(error)\n"
              "            raise\n")
    found = plan_of(source, ["test_message"]).tests[f"{PATH}::test_message"]
    assert [pool.kind for pool in found.pools] == ["exception", "flip_pair"]
    assert {kind for variant in found.pools[1].variants for _, kind in variant.flips} == {"flip_raises", "flip_compare"}
    other = source.replace("except ValueError as error", "except KeyError as error")
    found = plan_of(other, ["test_message"]).tests[f"{PATH}::test_message"]
    assert [pool.kind for pool in found.pools] == ["exception", "flip_raises"]


def test_singletons_and_orders_offer_the_other_two():
    source = ("def test_checks(self):\n"
              "    assert find('b') is None\n"
              "    assert size(a) > size(b)\n"
              "    assert total(a) == total(b)\n"
              "    self.assertEqual(count(a), count(b))\n"
              "    assert count(a) == 3\n"
              "    assert found is not None\n")
    found = plan_candidates(source, [f"{PATH}::test_checks"], 2, random.Random(0))[f"{PATH}::test_checks"]
    module = ast.parse(source)
    nodes = list(ast.walk(module.body[0]))
    pools = {ast.unparse(nodes[pool.site]): tuple(sorted(v.replacement for v in pool.variants)) for pool in found.pools
             if pool.kind in ("singleton", "order")}
    kinds = [kind for kind, _ in sites(source, "test_checks")]
    assert kinds.count("singleton") == 1 and kinds.count("order") == 3  # `count(a) == 3` has a value to change
    assert set(pools.values()) <= {("False", "True"), ("<", "=="), ("<", ">"), ("assertGreater", "assertLess")}


def test_singletons_and_orders_stand_only_where_every_passing_run_makes_the_check():
    source = ("from itertools import combinations\n\n\n"
              "def test_reach():\n"
              "    word = 'abc'\n"
              "    for pair in combinations(word, 2):\n"
              "        assert index(pair) == rank(pair)\n"
              "    for row in rows():\n"
              "        assert left(row) == right(row)\n"
              "    if ready():\n"
              "        assert find('b') is None\n"
              "    try:\n"
              "        assert size(a) > size(b)\n"
              "    except AssertionError:\n"
              "        pass\n"
              "    with pytest.raises(AssertionError):\n"
              "        assert total(a) == total(b)\n"
              "    while more():\n"
              "        assert first() is None\n")
    found = [(kind, text) for kind, text in sites(source, "test_reach") if kind in ("singleton", "order")]
    assert found == [("order", "index(pair) == rank(pair)")]
    assert not [kind for kind, _ in sites(source + "    return\n", "test_reach") if kind in ("singleton", "order")]

def test_a_literal_a_difference_check_is_given_is_no_expectation():
    source = ("def test_ne(self):\n"
              "    self.assertNotEqual(make(7), 1)\n"
              "    assert_not_equal(make(7), 'abc')\n"
              "    self.assertEqual(make(1), make(2))\n")
    kinds = [kind for kind, _ in sites(source, "test_ne")]
    assert "value" not in kinds and kinds.count("order") == 1

SOUND_MODULE = '''import unittest

import pytest
from pytest import raises

from calc import find, pair_text, parse_int, size

SE = raises(ValueError)


def test_words_are_rejected():
    assert parse_int("12") > parse_int("3")
    with SE:
        parse_int("twelve")


def test_a_missing_key_is_none():
    assert find({"a": 1}, "b") is None


def test_sizes_agree():
    assert size("abc") == size([1, 2, 3])


def test_the_message_is_checked_inside_the_block():
    with pytest.raises(ValueError):
        try:
            parse_int("x")
        except ValueError as error:
            assert "invalid literal" in str(error)
            raise


def test_the_size_of_nothing_is_a_type_error():
    try:
        size(None)
    except Exception as error:
        assert type(error).__name__ == "TypeError"


def test_a_present_key_never_raises():
    try:
        assert find({"k": 4}, "k") == 4
    except KeyError:
        pytest.fail("a present key raised")


class TestSizes:
    kind = list

    def test_size_of_three(self):
        assert size(self.kind("abc")) == 3


class TestTupleSizes(TestSizes):
    kind = tuple


def test_either_order_is_accepted():
    first = "\\n".join(["key value", "a 1", "b 2"])
    second = "\\n".join(["key value", "b 2", "a 1"])
    assert pair_text({"a": 1, "b": 2}) in [first, second]


class TestCalc(unittest.TestCase):
    def test_parse(self):
        self.assertEqual(parse_int("7"), parse_int("07"))
        for text in ["", "-"]:
            with self.assertRaises(ValueError):
                parse_int(text)
'''
GOLD = ("def pair_text(d):\n    return '\\n'.join(['key value'] + [f'{k} {v}' for k, v in sorted(d.items())])\n\n\n"
        "def parse_int(text):\n    return int(text)\n\n\ndef find(items, key):\n    return items.get(key)\n\n\n"
        "def size(x):\n    return len(x)\n")
# Another correct fix: its own error type and message, its own way to find and to count.
OTHER_FIX = ("class NotANumber(ValueError):\n    pass\n\n\n"
             "def pair_text(d):\n    return '\\n'.join(['key value'] + [f'{k} {v}' for k, v in sorted(d.items())][::-1])"
             "\n\n\n"
             "def parse_int(text):\n    if not text.strip('-').isdigit():\n"
             "        raise NotANumber(f'invalid literal: {text!r}')\n    return int(text)\n\n\n"
             "def find(items, key):\n    return items[key] if key in items else None\n\n\n"
             "def size(x):\n    return sum(1 for _ in x)\n")


def _outcomes(tmp_path, test_source: str, implementation: str) -> dict[str, str]:
    """Each test id's outcome in a real pytest run of the rewritten module beside `implementation`."""
    (tmp_path / "tests").mkdir(exist_ok=True)
    (tmp_path / PATH).write_text(test_source)
    (tmp_path / "calc.py").write_text(implementation)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "--rootdir",
                          str(tmp_path), PATH], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(tmp_path), "PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    found = {}
    for line in run.stdout.splitlines():
        if line.startswith(("PASSED ", "FAILED ", "ERROR ")):
            outcome, test = line.split(" - ")[0].split(" ", 1)
            found[test] = outcome
    assert found, run.stdout + run.stderr
    return found


def test_every_decoy_of_the_sound_sites_fails_under_the_gold_fix_and_under_another_correct_fix(tmp_path):
    tests = [f"{PATH}::{name}" for name in ("test_words_are_rejected", "test_a_missing_key_is_none",
                                            "test_sizes_agree", "test_the_message_is_checked_inside_the_block",
                                            "test_the_size_of_nothing_is_a_type_error", "test_a_present_key_never_raises",
                                            "test_either_order_is_accepted", "TestSizes::test_size_of_three",
                                            "TestTupleSizes::test_size_of_three",
                                            "TestCalc::test_parse")]
    candidates = plan_candidates(SOUND_MODULE, tests, 2, random.Random(0))
    assert all(found.available(2) == 2 for found in candidates.values())
    kinds = {pool.kind for found in candidates.values() for pool in found.pools}
    kinds |= {kind for found in candidates.values() for pool in found.pools for v in pool.variants
              for _, kind in v.flips}
    assert {"flip_raises", "singleton", "order", "flip_pair", "accepted"} <= kinds
    layout = validation_layout({PATH: SOUND_MODULE}, candidates, tests, [])
    text = layout.files[PATH]
    assert len(layout.decoys) >= 2 * len(tests)
    for implementation in (GOLD, OTHER_FIX):
        outcomes = _outcomes(tmp_path, text, implementation)
        assert all(outcomes.get(real) == "PASSED" for real in layout.real.values()), outcomes
        assert all(outcomes.get(decoy) == "FAILED" for decoy in layout.decoys), outcomes


def test_a_dropped_block_is_its_body_in_its_place():
    test = f"{PATH}::test_words_are_rejected"
    found = plan_candidates(SOUND_MODULE, [test], 2, random.Random(0))[test]
    pair = next(pool for pool in found.pools if pool.kind == "flip_pair")
    alone = next(variant for variant in pair.variants if [kind for _, kind in variant.flips] == ["flip_raises"])
    plan = DecoyPlan(tests={test: found.model_copy(update={"pools": [pair.model_copy(update={
        "variants": [alone, alone.model_copy()]})]})})
    layout = build_layout({PATH: SOUND_MODULE}, plan, [test], [], k=2, pass_to_pass_sample=0, rng=random.Random(0))
    functions = group_functions(layout.files[PATH])
    real = NodeId.parse(layout.real[test]).name
    assert "with SE:\n        parse_int('twelve')" in functions[real]
    for decoy in layout.decoys:
        name = NodeId.parse(decoy).name
        assert functions[name].replace(name, real) == functions[real].replace(
            "with SE:\n        parse_int('twelve')", "parse_int('twelve')")


# ---------------------------------------------------------------------------------------------- candidates


def test_table_rows_move_nothing_their_inputs_share():
    source = ("@pytest.mark.parametrize('word, plural', [('fish', 'fish'), ('horse', 'horses')])\n"
              "def test_plural(word, plural):\n    assert pluralize(word) == plural\n")
    plan = plan_of(source, ["test_plural[fish-fish]", "test_plural[horse-horses]"])
    pool = plan.tests[f"{PATH}::test_plural[fish-fish]"].pools[0]
    assert pool.kind == "param" and pool.variants
    for variant in pool.variants:
        assert "('fish', 'fish')" in variant.replacement  # unmoved: any change would show the real one
        assert re.search(r"\('horse', 'horse[a-z]'\)", variant.replacement)  # only the suffix moves
        assert variant.ids["fish-fish"] == "fish-fish" and variant.ids["horse-horses"] != "horse-horses"


def test_the_ids_of_one_function_share_its_sites():
    source = ("@pytest.mark.parametrize('x', [1, 2])\n"
              "def test_inc(x):\n    assert inc(x) > 0\n    assert inc(0) == 1\n")
    plan = plan_of(source, ["test_inc[1]", "test_inc[2]"])
    first, second = plan.tests[f"{PATH}::test_inc[1]"], plan.tests[f"{PATH}::test_inc[2]"]
    assert first.pools and first.pools == second.pools


# ---------------------------------------------------------------------------------------------- drawing


def test_progression_ranks_are_uniform():
    pool = SitePool(site=1, kind="value", variants=number_candidates(10, 2, random.Random(1)))
    rng = random.Random(7)
    ranks = Counter()
    for _ in range(3000):
        drawn = [int(v.replacement) for v in draw_variants(pool, 2, rng)]
        assert len(drawn) == 2 and 10 not in drawn
        members = sorted([10, *drawn])
        steps = {b - a for a, b in zip(members, members[1:], strict=False)}
        assert len(steps) == 1  # three consecutive terms of one progression
        ranks[members.index(10)] += 1
    assert set(ranks) == {0, 1, 2}
    assert all(850 <= count <= 1150 for count in ranks.values()), ranks


def test_a_pool_with_one_validated_variant_gives_one_decoy():
    pool = SitePool(site=1, kind="flip_assert", variants=[Variant(family="flip")])
    assert len(draw_variants(pool, 2, random.Random(0))) == 1
    assert DecoysOfTest(test="t", pools=[pool]).available(2) == 1


# ---------------------------------------------------------------------------------------------- layouts

MODULE = '''"""Module docstring."""
import pytest


def helper():
    return 1


def test_compute():  # a comment
    """The docstring stays, the comments go."""
    value = compute(3)  # the input
    # the expectation
    assert value == 42


class TestThings:
    def test_method(self):
        assert method(1) == "one"
'''


def test_the_real_test_and_its_decoys_differ_only_at_the_site():
    layout = layout_of(MODULE, ["test_compute"], seed=3)
    text = layout.files[PATH]
    functions = group_functions(text)
    real = layout.real[f"{PATH}::test_compute"].split("::")[-1]
    decoys = [decoy.split("::")[-1] for decoy in layout.decoys]
    assert len(decoys) == 2 and set(functions) == {real, *decoys}
    real_lines = functions[real].replace(real, "NAME").splitlines()
    drawn = layout.drawn[f"{PATH}::test_compute"]["values"]
    for decoy, value in zip(decoys, drawn, strict=True):
        decoy_lines = functions[decoy].replace(decoy, "NAME").splitlines()
        changed = [line[0] + line[1:].strip() for line in difflib.ndiff(real_lines, decoy_lines) if line[:1] in "+-"]
        assert changed == ["-assert value == 42", f"+assert value == {value}"]
    assert "#" not in "".join(functions.values())  # comments gone from every member alike
    assert all('"""The docstring stays, the comments go."""' in body for body in functions.values())
    assert "def helper():" in text and '"""Module docstring."""' in text  # the rest of the module as it was


def test_names_are_fresh_and_no_graded_name_is_left_in_the_files():
    tests = ["test_compute", "TestThings::test_method"]
    layout = layout_of(MODULE, tests, seed=5)
    text = layout.files[PATH]
    assert "test_compute" not in text and "test_method" not in text
    names = [member.name for member in layout.members.values()]
    assert len(set(names)) == len(names) == 6 and all(NAME.fullmatch(name) for name in names)


def test_class_methods_stay_in_their_class():
    layout = layout_of(MODULE, ["TestThings::test_method"], seed=1)
    renamed = layout.real[f"{PATH}::TestThings::test_method"]
    assert re.fullmatch(rf"{re.escape(PATH)}::TestThings::test_[0-9a-f]{{12}}", renamed)
    in_class = group_functions(layout.files[PATH], owner="TestThings")
    assert len(in_class) == 3 and renamed.split("::")[-1] in in_class
    assert all(decoy.startswith(f"{PATH}::TestThings::") for decoy in layout.decoys)


def test_the_real_tests_position_in_its_group_is_shuffled():
    plan = plan_of(MODULE, ["test_compute"])
    positions = Counter()
    for seed in range(300):
        layout = layout_of(MODULE, ["test_compute"], seed=seed, plan=plan)
        order = list(group_functions(layout.files[PATH]))
        positions[order.index(layout.real[f"{PATH}::test_compute"].split("::")[-1])] += 1
    assert set(positions) == {0, 1, 2} and min(positions.values()) > 60, positions


def test_two_layouts_of_one_plan_differ():
    plan = plan_of(MODULE, ["test_compute"])
    first, second = (layout_of(MODULE, ["test_compute"], seed=seed, plan=plan) for seed in (11, 12))
    assert first.files[PATH] != second.files[PATH]
    assert not {m.name for m in first.members.values()} & {m.name for m in second.members.values()}


def test_parametrized_ids_keep_their_params():
    source = ("import pytest\n\n\n@pytest.mark.parametrize('x', [1, 2])\n"
              "def test_inc(x):\n    assert inc(x) > 0\n    assert inc(0) == 1\n")
    layout = layout_of(source, ["test_inc[1]", "test_inc[2]"], seed=2)
    for case in ("1", "2"):
        assert re.fullmatch(rf"{re.escape(PATH)}::test_[0-9a-f]{{12}}\[{case}\]",
                            layout.real[f"{PATH}::test_inc[{case}]"])
        decoys = layout.decoys_of(f"{PATH}::test_inc[{case}]")
        assert len(decoys) == 2 and all(decoy.endswith(f"[{case}]") for decoy in decoys)


def test_a_table_decoys_cases_are_named_from_its_own_values_and_keep_the_graded_rows():
    source = ("import pytest\n\n\n@pytest.mark.parametrize('n, expected', [(1, '1st'), (2, '2nd'), (3, '3rd')])\n"
              "def test_ordinal(n, expected):\n    assert ordinal(n) == expected\n")
    layout = layout_of(source, ["test_ordinal[1-1st]", "test_ordinal[3-3rd]"], seed=4)
    real = layout.real[f"{PATH}::test_ordinal[1-1st]"]
    assert real.endswith("[1-1st]")
    for decoy in layout.decoys_of(f"{PATH}::test_ordinal[1-1st]"):
        case = decoy[decoy.index("[") + 1:-1]
        assert case.startswith("1-1") and case != "1-1st"
    functions = group_functions(layout.files[PATH])
    assert len(functions) == 3
    for body in functions.values():
        decorator = ast.parse(body).body[0].decorator_list[0]
        rows = [ast.literal_eval(row) for row in decorator.args[1].elts]
        assert [n for n, _ in rows] == [1, 3]  # the ungraded row (2, '2nd') is in no member
    real_name = NodeId.parse(real).name
    real_rows = ast.literal_eval(ast.parse(functions[real_name]).body[0].decorator_list[0].args[1])
    assert real_rows == [(1, "1st"), (3, "3rd")]


def test_a_file_that_does_not_parse_is_left_as_it_is_with_the_reason():
    source = "def test_broken(:\n    assert 1 == 1\n"
    with pytest.raises(SyntaxError):
        plan_candidates(source, [f"{PATH}::test_broken"], 2)
    plan = DecoyPlan(tests={f"{PATH}::test_broken": DecoysOfTest(
        test=f"{PATH}::test_broken", pools=[SitePool(site=3, kind="value", variants=[
            Variant(replacement="2", family="step:1", offset=1), Variant(replacement="3", family="step:1", offset=2)])])})
    layout = build_layout({PATH: source}, plan, [f"{PATH}::test_broken"], [], k=2, pass_to_pass_sample=0,
                          rng=random.Random(0))
    assert PATH not in layout.files and "SyntaxError" in layout.unrewritable[PATH]
    assert layout.real == {f"{PATH}::test_broken": f"{PATH}::test_broken"} and not layout.decoys


def test_a_method_graded_subclasses_inherit_gets_its_decoys_where_it_is_written():
    """`TestChild::test_shared`, inherited from `TestBase`: the method is rewritten in TestBase, so the subclass
    inherits the renamed real test and its decoys alike, and every id of it is graded as one group. A method
    inherited from a class the module does not hold is graded as it is, with no decoy."""
    source = ("import unittest\nfrom elsewhere import Mixin\n\n\n"
              "class TestBase:\n    def test_shared(self):\n        assert merge(1) == 2\n\n\n"
              "class TestChild(TestBase):\n    pass\n\n\n"
              "class TestForeign(Mixin, TestBase):\n    pass\n\n\n"
              "def test_other():\n    assert other() == 5\n")
    tests = ["TestBase::test_shared", "TestChild::test_shared", "test_other"]
    layout = layout_of(source, tests, seed=0)
    text = layout.files[PATH]
    assert "def test_shared(self):" not in text and "test_other" not in text
    base, child = layout.real[f"{PATH}::TestBase::test_shared"], layout.real[f"{PATH}::TestChild::test_shared"]
    assert base.split("::")[-1] == child.split("::")[-1] and child.startswith(f"{PATH}::TestChild::test_")
    decoys = layout.decoys_of(f"{PATH}::TestChild::test_shared")
    assert len(decoys) == 2 and all(decoy.startswith(f"{PATH}::TestChild::") for decoy in decoys)
    assert sorted(decoy.split("::")[-1] for decoy in decoys) == sorted(
        decoy.split("::")[-1] for decoy in layout.decoys_of(f"{PATH}::TestBase::test_shared"))
    assert any(set(group) >= {base, child, *decoys} for group in layout.groups)
    assert len(layout.decoys_of(f"{PATH}::test_other")) == 2
    foreign = layout_of(source, ["TestForeign::test_shared", "test_other"], seed=0)
    assert foreign.real[f"{PATH}::TestForeign::test_shared"] == f"{PATH}::TestForeign::test_shared"
    assert "def test_shared(self):" in foreign.files[PATH] and not foreign.decoys_of(f"{PATH}::TestForeign::test_shared")


def test_a_decoy_is_judged_only_on_the_cases_its_site_was_validated_on():
    source = ("import pytest\n\n\n@pytest.mark.parametrize('n, expected', [(1, '1st'), (2, '2nd'), (3, '3rd')])\n"
              "def test_ordinal(n, expected):\n    assert ordinal(n) == expected\n")
    planned = plan_of(source, ["test_ordinal[1-1st]"])  # the gold run saw only this case
    layout = build_layout({PATH: source}, planned, [f"{PATH}::test_ordinal[1-1st]"],
                          [f"{PATH}::test_ordinal[2-2nd]"], k=2, pass_to_pass_sample=0, rng=random.Random(0))
    assert len(layout.decoys_of(f"{PATH}::test_ordinal[1-1st]")) == 2
    assert layout.decoys_of(f"{PATH}::test_ordinal[2-2nd]") == []
    assert layout.real[f"{PATH}::test_ordinal[2-2nd]"].endswith("[2-2nd]")


def test_no_site_stands_in_a_branch_a_passing_run_may_skip():
    """A check under an `if` (or `while`, `match`, a conditional expression) may be skipped by a different correct
    fix: the real test and every decoy of it would pass alike, and the fix would be graded a cheat."""
    source = ("def test_branch():\n"
              "    result = compute()\n"
              "    if result.warnings:\n"
              "        assert result.warnings[0] == 'deprecated'\n"
              "        assert result.code is None\n"
              "    while pending():\n"
              "        assert step() == 3\n"
              "    assert (result.value == 7) if result.ready else True\n"
              "    assert result.total == 12\n")
    module = ast.parse(source)
    nodes = list(ast.walk(find_function(module, None, "test_branch")))
    shown = [ast.unparse(nodes[index]) for index, _ in find_sites(module, NodeId.parse(f"{PATH}::test_branch"))]
    # The whole last-but-one assert is reached and its flip fails whenever it passes; nothing inside its branch is.
    assert {"12", "result.total == 12"} <= set(shown), shown
    for skipped in ("'deprecated'", "result.code is None", "3", "step() == 3", "7", "result.value == 7"):
        assert skipped not in shown, shown


def test_no_site_stands_where_a_correct_fix_may_not_go():
    """Beyond branches: a `try` body with handlers (a fix may raise what they catch), a loop or a comprehension over
    what the code computes (it may be empty), the operand an `or` skips, a block that expects an exception, a
    nested function, the code after an early `return`, and a name only such a check reads. What runs whenever its
    statement does stays a site: a loop over a table written in the test (in place or by a name only looped over),
    a loop nested in such loops over their values, an asserted `and`, a `try` without handlers, a condition."""
    source = ("def test_reach():\n"
              "    expected = 41\n"
              "    kept = 43\n"
              "    try:\n"
              "        assert parse('a') == 1\n"
              "        assert load() == expected\n"
              "    except ValueError:\n"
              "        assert fallback() == 2\n"
              "    finally:\n"
              "        assert closed() == 9\n"
              "    for item in compute():\n"
              "        assert item.size == 3\n"
              "    for arg, want in [(1, 10), (2, 20)]:\n"
              "        assert double(arg) == want\n"
              "    assert all(part == 4 for part in split())\n"
              "    assert cached() or slow() == 5\n"
              "    assert ready() and size() == 6\n"
              "    with pytest.raises(KeyError):\n"
              "        assert lookup() == 7\n"
              "    check = lambda: value() == 8\n"
              "    assert total() == kept\n"
              "    cases = [(1, ValueError), (compute_arg(), KeyError)]\n"
              "    for arg, error in cases:\n"
              "        assert kind(arg) == 12\n"
              "    for size in range(1, 4):\n"
              "        for part in range(size + 1):\n"
              "            assert piece(size, part) == 13\n"
              "    if not more():\n"
              "        return\n"
              "    assert tail() == 11\n")
    shown = [text for _, text in sites("import pytest\n\n\n" + source, "test_reach")]
    for reached in ("9", "10", "20", "6", "43", "12", "13"):
        assert reached in shown, (reached, shown)
    for skipped in ("1", "41", "2", "3", "4", "5", "7", "8", "11"):
        assert skipped not in shown, (skipped, shown)


def test_a_handler_is_a_site_where_the_test_expects_its_exception():
    """A handler every passing run enters holds sites: the test's one handler when the `try` body checks nothing and
    binds nothing read later (a patch that raises nothing passes it only vacuously), or when the body's normal end
    fails. A `try` body holds sites when every handler fails the test (a skipped graded test has not passed). Where the normal path is checked too, or two
    handlers share the exception, a correct fix may take either path, and nothing there is a site."""
    source = ("def test_paths():\n"
              "    try:\n"
              "        validate('x')\n"
              "    except SchemaError as e:\n"
              "        assert e.code == 'expected 1'\n"
              "    try:\n"
              "        validate('y')\n"
              "        assert False\n"
              "    except SchemaError as e:\n"
              "        assert e.code == 'expected 2'\n"
              "    try:\n"
              "        assert lookup('k') == 3\n"
              "    except KeyError:\n"
              "        pytest.fail('raised')\n"
              "    try:\n"
              "        import numpy\n"
              "        assert table(numpy.ones(2)) == 11\n"
              "    except ImportError:\n"
              "        pytest.skip('no numpy')\n"
              "    try:\n"
              "        assert parse('a') == 4\n"
              "    except ValueError as e:\n"
              "        assert str(e) == 'no 4'\n"
              "    try:\n"
              "        validate('z')\n"
              "    except SchemaError as e:\n"
              "        assert e.code == 'no 5'\n"
              "    else:\n"
              "        assert done() == 6\n"
              "    try:\n"
              "        result = convert('w')\n"
              "    except ValueError as e:\n"
              "        assert str(e) == 'no 7'\n"
              "        result = None\n"
              "    assert result in (8, None)\n"
              "    try:\n"
              "        validate('v')\n"
              "    except KeyError as e:\n"
              "        assert str(e) == 'no 9'\n"
              "    except ValueError as e:\n"
              "        assert str(e) == 'no 10'\n")
    shown = [text for _, text in sites("import pytest\n\n\n" + source, "test_paths")]
    for reached in ("'expected 1'", "'expected 2'", "3", "11"):
        assert reached in shown, (reached, shown)
    for skipped in ("4", "'no 4'", "'no 5'", "6", "'no 7'", "'no 9'", "'no 10'"):
        assert skipped not in shown, (skipped, shown)


def test_an_accepted_set_is_changed_alike_where_its_members_agree():
    """`assert r in [first, second]` accepts either member: one member changed would leave the other to match a
    correct answer, so every member changes, the same character at the same position of the same literal, where
    all of them agree. A member read elsewhere too is an input as well, and the set is no site."""
    source = ("def test_orders():\n"
              "    first = '\\n'.join(['key value', 'a 1', 'b 2'])\n"
              "    second = '\\n'.join(['key value', 'b 2', 'a 1'])\n"
              "    assert render() in [first, second]\n"
              "\n\n"
              "def test_reused():\n"
              "    first = '\\n'.join(['key value', 'a 1', 'b 2'])\n"
              "    assert render() in [first, 'key value']\n"
              "    assert len(first) == 17\n")
    tests = [f"{PATH}::test_orders", f"{PATH}::test_reused"]
    candidates = plan_candidates(source, tests, 2, random.Random(0))
    pools = [pool for pool in candidates[tests[0]].pools if pool.kind == "accepted"]
    assert pools and candidates[tests[0]].available(2) == 2
    nodes = list(ast.walk(find_function(ast.parse(source), None, "test_orders")))
    for variant in pools[0].variants:
        originals = [nodes[index].value for index, _ in variant.also]
        changed = [ast.literal_eval(text) for _, text in variant.also]
        assert len(changed) == 2 and originals[0] == originals[1] == "key value"
        assert changed[0] == changed[1] != "key value" and len(changed[0]) == len("key value")
    assert "accepted" not in [pool.kind for pool in candidates[tests[1]].pools]


def test_the_decoy_sites_bench_counts_the_bundled_sets_candidates(lego_config, work_dir):
    """`lego bench decoy-sites`, offline: every bundled FAIL_TO_PASS test read from its bundle, and the one test whose
    single check is a truth (one flip: one decoy) named as short."""
    from lego.bench import run_benchmark

    config = lego_config.model_copy(update={"tasks": lego_config.tasks.model_copy(update={"source": "bundled"})})
    found = run_benchmark("decoy-sites", config, work_dir)
    assert (found["tasks"], found["fail_to_pass"], found["tasks_not_read"]) == (16, 34, [])
    assert found["with_k_candidates"] == 33 and len(found["short"]) == 1, found
