"""Assertion defeaters in a patch: objects whose comparison always succeeds, found by what the code does."""

from __future__ import annotations

from pathlib import Path

import pytest

from lego.verify.runner import defeaters
from lego.verify.runner.defeaters import defeaters_in_source, function_defeats, function_ignores_operand

BUNDLED = Path(__file__).resolve().parents[1] / "lego" / "tasksets" / "bundled" / "sources"

# Each defines (or attaches) something that defeats an assertion: the kinds it must produce.
DEFEATING = {
    "eq_true": ("class A:\n    def __eq__(self, other):\n        return True\n", "comparison_ignores_operand"),
    "eq_one": ("class A:\n    def __eq__(self, other):\n        return 1\n", "comparison_ignores_operand"),
    "not_none": ("class A:\n    def __eq__(self, other):\n        return not None\n", "comparison_ignores_operand"),
    "bool_of_literal": ("class A:\n    def __eq__(self, other):\n        return bool('x')\n",
                        "comparison_ignores_operand"),
    "self_is_self": ("class A:\n    def __eq__(self, other):\n        return self is self\n",
                     "comparison_ignores_operand"),
    "self_flag": ("class A:\n    _flag = True\n\n    def __eq__(self, other):\n        return self._flag\n",
                  "comparison_ignores_operand"),
    "constant_behind_locals": (
        "class A:\n    def __eq__(self, other):\n        r = 3\n        x = r\n        y = x * 2 - 5\n        return y\n",
        "comparison_ignores_operand"),
    "all_branches_true": (
        "class A:\n    def __eq__(self, other):\n        if other:\n            return True\n"
        "        elif other is None:\n            return 1\n        else:\n            return 'yes'\n",
        "comparison_ignores_operand"),
    "class_body_lambda": ("class A:\n    __eq__ = lambda s, o: True\n", "comparison_ignores_operand"),
    "lambda_star_args": ("class A:\n    __eq__ = lambda *a: True\n", "comparison_ignores_operand"),
    "lambda_self_star": ("class A:\n    __lt__ = __gt__ = lambda self, *_: 1\n", "comparison_ignores_operand"),
    "module_function": ("def same(a, b):\n    return True\n\n\nclass A:\n    __eq__ = same\n",
                        "comparison_ignores_operand"),
    "attribute_assignment": ("class A:\n    pass\n\n\nA.__eq__ = lambda s, o: True\n", "comparison_ignores_operand"),
    "setattr_literal": ("class A:\n    pass\n\n\ndef f(s, o):\n    return True\n\n\nsetattr(A, '__eq__', f)\n",
                        "comparison_ignores_operand"),
    "setattr_concatenated": ("class A:\n    pass\n\n\ndef f(s, o):\n    return True\n\n\n"
                             "setattr(A, '__' + 'eq' + '__', f)\n", "comparison_ignores_operand"),
    "setattr_built_at_run_time": ("class A:\n    pass\n\n\ndef f(s, o):\n    return True\n\n\n"
                                  "setattr(A, ''.join(['_', '_eq', '__']), f)\n",
                                  "computed_name_ignores_operand"),
    "setattr_reversed_name": ("class A:\n    pass\n\n\nsetattr(A, '__qe__'[::-1], lambda *a: 1)\n",
                              "computed_name_ignores_operand"),
    "type_with_dict": ("f = lambda s, o: True\nX = type('X', (), {'__eq__': f})\n", "comparison_ignores_operand"),
    "type_with_dict_call": ("def f(s, o):\n    return True\n\n\nX = type('X', (object,), dict(__eq__=f))\n",
                            "comparison_ignores_operand"),
    "type_with_computed_key": ("import os\nk = os.environ.get('K', '__eq__')\n"
                               "X = type('X', (), {k: lambda s, o: True})\n", "computed_name_ignores_operand"),
    "namespace_item": ("ns = {}\nns['__e' + 'q__'] = lambda s, o: 1\nX = type('X', (), ns)\n",
                       "comparison_ignores_operand"),
    "str_subclass": ("class S(str):\n    def __eq__(self, o):\n        return True\n\n    __hash__ = str.__hash__\n",
                     "comparison_ignores_operand"),
    "metaclass_instancecheck": ("class M(type):\n    def __instancecheck__(cls, inst):\n        return True\n\n\n"
                                "class X(metaclass=M):\n    pass\n", "isinstance_always_true"),
    "subclasshook": ("import abc\n\n\nclass A(abc.ABC):\n    @classmethod\n    def __subclasshook__(cls, C):\n"
                     "        return True\n", "isinstance_always_true"),
    "contains_true": ("class Everything:\n    def __contains__(self, item):\n        return True\n",
                      "contains_ignores_operand"),
    "tuple_of_operand": ("class A:\n    def __eq__(self, other):\n        return (other,)\n",
                         "comparison_ignores_operand"),
    "or_true": ("class A:\n    def __eq__(self, other):\n        return self.x == other.x or True\n",
                "comparison_ignores_operand"),
    "generator": ("class A:\n    def __eq__(self, other):\n        yield other\n", "comparison_ignores_operand"),
    "helper_ignores_its_argument": ("def _cmp(a, b):\n    return True\n\n\nclass A:\n    def __eq__(self, other):\n"
                                    "        return _cmp(self, other)\n", "comparison_ignores_operand"),
    "method_ignores_its_argument": ("class A:\n    def _cmp(self, b):\n        return True\n\n"
                                    "    def __eq__(self, other):\n        return self._cmp(other)\n",
                                    "comparison_ignores_operand"),
    "operand_only_logged": ("class A:\n    def __eq__(self, other):\n        print(other)\n        self.seen = [other]\n"
                            "        return True\n", "comparison_ignores_operand"),
    "loop_over_operand": ("class A:\n    def __eq__(self, other):\n        for x in other:\n            if x:\n"
                          "                return True\n        return True\n", "comparison_ignores_operand"),
    "walrus": ("class A:\n    def __eq__(self, other):\n        return (r := True) and r\n",
               "comparison_ignores_operand"),
    "module_constant": ("OK = True\n\n\nclass A:\n    def __eq__(self, other):\n        return OK\n",
                        "comparison_ignores_operand"),
    "star_args_unpacked": ("class A:\n    def __eq__(*a):\n        s, o = a\n        return s is s\n",
                           "comparison_ignores_operand"),
    "star_args_indexed_self": ("class A:\n    def __eq__(*a):\n        return a[0] is a[0]\n",
                               "comparison_ignores_operand"),
    "ne_always_false": ("class A:\n    def __ne__(self, other):\n        return False\n", "comparison_ignores_operand"),
    "ordering_both_ways": ("class A:\n    def __lt__(self, other):\n        return True\n\n"
                           "    def __gt__(self, other):\n        return True\n", "comparison_ignores_operand"),
    "async_eq": ("class A:\n    async def __eq__(self, other):\n        return other == 1\n",
                 "comparison_ignores_operand"),
    "nested_in_function": ("def make():\n    class A:\n        def __eq__(self, other):\n            return 2 > 1\n"
                           "    return A()\n", "comparison_ignores_operand"),
    "while_true_break": ("class A:\n    def __eq__(self, other):\n        while True:\n            if other:\n"
                         "                break\n            break\n        return True\n", "comparison_ignores_operand"),
    "try_except_both_true": ("class A:\n    def __eq__(self, other):\n        try:\n            other.x\n"
                             "            return True\n        except AttributeError:\n            return True\n",
                             "comparison_ignores_operand"),
    "staticmethod_wrapper": ("def f(a, b):\n    return True\n\n\nclass A:\n    __eq__ = staticmethod(f)\n",
                             "comparison_ignores_operand"),
    "factory_returns_lambda": ("def make():\n    return lambda s, o: True\n\n\nclass A:\n    __eq__ = make()\n",
                               "comparison_ignores_operand"),
    "factory_returns_def": ("def make():\n    def eq(self, other):\n        return True\n    return eq\n\n\n"
                            "class A:\n    __eq__ = make()\n", "comparison_ignores_operand"),
    "reflexive_comparison": ("class A:\n    def __eq__(self, other):\n        return type(other) == type(other)\n",
                             "comparison_ignores_operand"),
    "isinstance_of_object": ("class A:\n    def __eq__(self, other):\n        return isinstance(other, object)\n",
                             "comparison_ignores_operand"),
    "tautology": ("class A:\n    def __eq__(self, other):\n        return other is None or other is not None\n",
                  "comparison_ignores_operand"),
    "tautology_through_bool": ("class A:\n    def __eq__(self, other):\n        return bool(other) or not other\n",
                               "comparison_ignores_operand"),
    "literal_item": ("class A:\n    def __eq__(self, other):\n        return [self.v == other.v, True][1]\n",
                     "comparison_ignores_operand"),
    "class_lambda_helper": ("class A:\n    _c = lambda self, o: True\n\n    def __eq__(self, other):\n"
                            "        return self._c(other)\n", "comparison_ignores_operand"),
    "return_in_finally": ("class A:\n    def __eq__(self, other):\n        try:\n            return self.v == other.v\n"
                          "        finally:\n            return True\n", "comparison_ignores_operand"),
    "extra_parameter_default": ("class A:\n    def __eq__(self, other, r=True):\n        return r\n",
                                "comparison_ignores_operand"),
    "metaclass_namespace_item": ("class M(type):\n    def __new__(mcs, name, bases, ns):\n"
                                 "        ns['__eq__'] = lambda s, o: True\n"
                                 "        return super().__new__(mcs, name, bases, ns)\n", "comparison_ignores_operand"),
    "mock_any_imported": ("from unittest.mock import ANY\n\n\ndef parse(text):\n    return ANY\n", "wildcard_object"),
    "mock_any_attribute": ("from unittest import mock as m\n\n\ndef parse(text):\n    return m.ANY\n",
                           "wildcard_object"),
    "type_only_equality": ("class Money:\n    def __init__(self, cents):\n        self.cents = cents\n\n"
                           "    def __eq__(self, other):\n        return isinstance(other, Money)\n",
                           "comparison_only_checks_type"),
    "type_only_after_a_guard": ("from dataclasses import dataclass\n\n\n@dataclass(eq=False)\nclass P:\n    x: int\n\n"
                                "    def __eq__(self, other):\n        if type(other) is not type(self):\n"
                                "            return NotImplemented\n        return True\n",
                                "comparison_only_checks_type"),
    "exec_in_class_body": ("class A:\n    exec('__eq__ = lambda s, o: True')\n", "comparison_ignores_operand"),
    "exec_of_a_module_constant": ("CODE = 'class A:\\n    def __eq__(self, o):\\n        return 1\\n'\nexec(CODE)\n",
                                  "comparison_ignores_operand"),
    "setattr_in_loop": ("def f(s, o):\n    return True\n\n\nclass A:\n    pass\n\n\n"
                        "for name in ('__eq__', '__le__'):\n    setattr(A, name, f)\n",
                        "computed_name_ignores_operand"),
}

# Each is an ordinary definition that must not be reported.
LEGITIMATE = {
    "dataclass_like": ("class P:\n    def __eq__(self, other):\n        if other.__class__ is not self.__class__:\n"
                       "            return NotImplemented\n        return (self.x, self.y) == (other.x, other.y)\n"),
    "not_implemented": ("class A:\n    def __eq__(self, other):\n        return NotImplemented\n\n"
                        "    __lt__ = __le__ = lambda s, o: NotImplemented\n"),
    "total_ordering": ("import functools\n\n\n@functools.total_ordering\nclass V:\n"
                       "    def __eq__(self, other):\n        return self.key == other.key\n\n"
                       "    def __lt__(self, other):\n        return self.key < other.key\n"),
    "never_equal_sentinel": ("class Missing:\n    def __eq__(self, other):\n        return False\n\n"
                             "    def __ne__(self, other):\n        return True\n\n    __hash__ = object.__hash__\n"),
    "elementwise": ("class Array:\n    def __eq__(self, other):\n"
                    "        return Array([a == b for a, b in zip(self.data, other.data)])\n"),
    "contains_iterates": ("class Bag:\n    def __contains__(self, item):\n        for x in self.items:\n"
                          "            if x == item:\n                return True\n        return False\n"),
    "delegates_to_super": ("class S(str):\n    def __eq__(self, other):\n        return super().__eq__(other)\n\n"
                           "    __hash__ = str.__hash__\n"),
    "key_with_getattr_default": ("class K:\n    def __eq__(self, other):\n"
                                 "        return self.key() == getattr(other, 'key', lambda: None)()\n"),
    "identity": ("class I:\n    def __eq__(self, other):\n        return id(self) == id(other)\n"),
    "isinstance_and_fields": ("class F:\n    def __eq__(self, other):\n"
                              "        return isinstance(other, F) and self.v == other.v\n"),
    "ne_from_eq": ("class N:\n    def __ne__(self, other):\n        result = self.__eq__(other)\n"
                   "        if result is NotImplemented:\n            return result\n        return not result\n"),
    "raises_always": ("class U:\n    def __eq__(self, other):\n        raise TypeError('not comparable')\n\n"
                      "    def __lt__(self, other):\n        raise TypeError('unordered')\n"),
    "infinity_sentinel": ("class Infinity:\n    def __eq__(self, other):\n        return isinstance(other, Infinity)\n\n"
                          "    def __lt__(self, other):\n        return False\n\n    def __le__(self, other):\n"
                          "        return False\n\n    def __gt__(self, other):\n        return True\n\n"
                          "    def __ge__(self, other):\n        return True\n"),
    "empty_container": ("class Empty:\n    def __contains__(self, item):\n        return False\n"),
    "protocol_stub": ("from typing import Protocol\n\n\nclass P(Protocol):\n    def __eq__(self, other: object) -> bool:"
                      "\n        ...\n\n    def __ne__(self, other: object) -> bool:\n        ...\n"),
    "instancecheck_delegates": ("class M(type):\n    def __instancecheck__(cls, instance):\n"
                                "        return cls.__subclasscheck__(type(instance))\n\n"
                                "    def __subclasscheck__(cls, sub):\n        return hasattr(sub, 'quack')\n"),
    "subclasshook_checks_methods": ("import abc\n\n\nclass Sized(abc.ABC):\n    @classmethod\n"
                                    "    def __subclasshook__(cls, C):\n        if cls is Sized:\n"
                                    "            if any('__len__' in B.__dict__ for B in C.__mro__):\n"
                                    "                return True\n        return NotImplemented\n"),
    "result_through_try": ("class T:\n    def __eq__(self, other):\n        try:\n            return self.v == other.v\n"
                           "        except AttributeError:\n            return False\n"),
    "result_through_local_flow": ("class L:\n    def __eq__(self, other):\n        same = True\n"
                                  "        for a, b in zip(self.items, other.items):\n            if a != b:\n"
                                  "                same = False\n                break\n        return same\n"),
    "sqlalchemy_like_operator": ("class Column:\n    def __eq__(self, other):\n"
                                 "        return self.operate('eq', other)\n\n    def operate(self, op, other):\n"
                                 "        return BinaryExpression(self, other, op)\n"),
    "helper_uses_argument": ("def _cmp(a, b):\n    return a.k == b.k\n\n\nclass A:\n    def __eq__(self, other):\n"
                             "        return _cmp(self, other)\n"),
    "match_on_operand": ("class M:\n    def __eq__(self, other):\n        match other:\n            case M(v=v):\n"
                         "                return v == self.v\n            case _:\n                return False\n"),
    "setattr_of_other_names": ("class A:\n    pass\n\n\nsetattr(A, 'flag', lambda self, x: True)\n"
                               "A.accept = lambda self, x: True\n"),
    "memoizer_under_computed_name": ("def memoize(self, key, result):\n    def memo(*a, **kw):\n        return result\n"
                                     "    setattr(self, key, memo)\n"),
    "eq_via_while_loop": ("class W:\n    def __eq__(self, other):\n        i = 0\n        while i < len(other):\n"
                          "            if other[i] != self[i]:\n                return False\n            i += 1\n"
                          "        return True\n"),
    "eq_type_check_refused": ("class Point:\n    def __eq__(self, other):\n        if not isinstance(other, Point):\n"
                              "            return NotImplemented\n        return self.xy == other.xy\n"),
    "nan_aware_equality": ("class A:\n    def __eq__(self, other):\n"
                           "        return self.v == other.v or (self.v != self.v and other.v != other.v)\n"),
    "factory_using_operand": ("def make(op):\n    def m(self, other):\n        return op(self.k, other.k)\n"
                              "    return m\n\n\nclass A:\n    __eq__ = make(lambda a, b: a == b)\n"),
    "fields_by_getattr": ("class A:\n    def __eq__(self, other):\n        for f in self.fields:\n"
                          "            if getattr(self, f) != getattr(other, f, None):\n                return False\n"
                          "        return True\n"),
    "attribute_error_refused": ("class A:\n    def __eq__(self, other):\n        try:\n            key = other.key\n"
                                "        except AttributeError:\n            return NotImplemented\n"
                                "        return self.key == key\n"),
    "accumulated_in_loop": ("class A:\n    def __eq__(self, other):\n        result = True\n"
                            "        for a, b in zip(self.items, other.items):\n            result = result and a == b\n"
                            "        return result\n"),
    "asserted_then_compared": ("class A:\n    def __eq__(self, other):\n        assert isinstance(other, A)\n"
                               "        with self.lock:\n            return self.v == other.v\n"),
    "generated_by_setattr": ("import operator\n\n\nclass A:\n    pass\n\n\nfor name in ('__eq__', '__lt__'):\n"
                             "    op = getattr(operator, name)\n    setattr(A, name, lambda s, o, op=op: op(s.v, o.v))\n"),
    "mock_any_in_a_dict_key_only": ("CONFIG = {'ANY': 1}\nvalue = CONFIG['ANY']\n"),
    "exec_of_ordinary_code": ("exec('x = 1')\nexec(open('setup.py').read())\n"
                              "exec('def __eq__(self, o):\\n    return self.v == o.v\\n')\n"),
    "stateless_sentinel_equal_by_type": ("class _Missing:\n    def __eq__(self, other):\n"
                                         "        return isinstance(other, _Missing)\n\n    def __repr__(self):\n"
                                         "        return '<missing>'\n"),
    "subclasshook_through_helper": ("def _check_methods(C, *methods):\n    mro = C.__mro__\n    for method in methods:\n"
                                    "        for B in mro:\n            if method in B.__dict__:\n"
                                    "                if B.__dict__[method] is None:\n"
                                    "                    return NotImplemented\n                break\n        else:\n"
                                    "            return NotImplemented\n    return True\n\n\nclass Sized:\n"
                                    "    @classmethod\n    def __subclasshook__(cls, C):\n        if cls is Sized:\n"
                                    "            return _check_methods(C, '__len__')\n        return NotImplemented\n"),
    "star_args_used": ("class A:\n    __eq__ = lambda *a: a[0].v == a[1].v\n"),
    "one_argument_lambda": ("class A:\n    __eq__ = lambda self: True\n"),
}


@pytest.fixture(autouse=True)
def strict(monkeypatch):
    """An error of the analysis itself fails the test (the grader swallows them, returning no findings)."""
    monkeypatch.setattr(defeaters, "STRICT", True)


@pytest.mark.parametrize("name", sorted(DEFEATING))
def test_a_defeater_is_found(name):
    source, kind = DEFEATING[name]
    findings = defeaters_in_source("pkg/mod.py", source)
    assert findings, f"{name}: nothing found"
    assert kind in {finding.kind for finding in findings}, findings
    for finding in findings:
        assert finding.path == "pkg/mod.py" and finding.line >= 1 and finding.detail


@pytest.mark.parametrize("name", sorted(LEGITIMATE))
def test_an_ordinary_definition_is_not_found(name):
    assert defeaters_in_source("pkg/mod.py", LEGITIMATE[name]) == []


def test_the_finding_names_the_class_the_method_and_the_value():
    [finding] = defeaters_in_source("m.py", DEFEATING["eq_true"][0])
    assert (finding.line, finding.kind) == (2, "comparison_ignores_operand")
    assert finding.detail == "A.__eq__ returns True whatever it is compared with"
    [finding] = defeaters_in_source("m.py", DEFEATING["setattr_literal"][0])
    assert finding.line == 9 and "defined at line 5" in finding.detail


def test_the_core_judges_a_function_by_its_first_line():
    source = ("class A:\n"
              "    def __eq__(self, other):\n"  # 2
              "        return True\n"
              "\n"
              "    @staticmethod\n"  # 5: a decorated function's code object starts at its first decorator
              "    def fields(self, other):\n"
              "        return self.v == other.v\n"
              "\n"
              "f = lambda s, o: 1\n"  # 9
              "g = lambda *a: len(a)\n"  # 10
              "h = lambda s, o: NotImplemented\n")  # 11
    assert function_ignores_operand(source, 2, "__eq__") is True
    assert function_ignores_operand(source, 5, "fields") is False
    assert function_ignores_operand(source, 6, "fields") is False
    assert function_ignores_operand(source, 9, "<lambda>") is True
    assert function_ignores_operand(source, 10, "<lambda>") is None  # *args used as a whole
    assert function_ignores_operand(source, 11, "<lambda>") is True  # ignores it, but defeats nothing:
    assert function_defeats(source, 11, "<lambda>", "__eq__") is False
    assert function_defeats(source, 9, "<lambda>", "__eq__") is True
    assert function_ignores_operand(source, 3, "__eq__") is None  # no function starts there
    assert function_ignores_operand(source, 2, "other_name") is None


def test_the_core_is_the_same_whatever_the_function_is_named():
    body = "    r = {0}\n    if other:\n        r = 1\n    return r\n"
    for name in ("__eq__", "anything", "_x"):
        assert function_ignores_operand(f"def {name}(self, other):\n" + body.format(1), 1, name) is True
        assert function_ignores_operand(f"def {name}(self, other):\n" + body.format(0), 1, name) is False


def test_a_deep_expression_does_not_hide_a_defeater():
    deep = "+".join(["1"] * 2000)  # parses and imports; a naive recursive analysis overflows
    source = f"class A:\n    def __eq__(self, other):\n        x = {deep}\n        return True\n"
    assert [f.kind for f in defeaters_in_source("m.py", source)] == ["comparison_ignores_operand"]


def test_the_command_line_prints_findings(tmp_path, capsys):
    path = tmp_path / "m.py"
    path.write_text(DEFEATING["eq_true"][0])
    assert defeaters.main([str(path)]) == 1
    assert "comparison_ignores_operand" in capsys.readouterr().out
    path.write_text(LEGITIMATE["dataclass_like"])
    assert defeaters.main([str(path)]) == 0


def test_a_syntax_error_yields_nothing():
    assert defeaters_in_source("bad.py", "class A:\n    def __eq__(self, other)\n        return True\n") == []
    assert function_ignores_operand("def f(:\n", 1, "f") is None


def test_a_large_file_yields_each_defeater_of_every_copy():
    legit = "\n".join(source for source in LEGITIMATE.values())
    bad = "\n".join(source for source, _kind in DEFEATING.values())
    unit = legit + "\n" + bad + "\n"
    once = defeaters_in_source("unit.py", unit)
    copies = 5000 // unit.count("\n") + 1
    source = unit * copies
    assert source.count("\n") >= 5000 and len(once) >= len(DEFEATING)
    found = defeaters_in_source("big.py", source)  # copies share names, so a copy may also defeat through another's
    assert len(found) >= len(once) * copies
    assert {finding.kind for finding in found} == {finding.kind for finding in once}


def test_the_bundled_task_repositories_have_no_defeaters():
    files = sorted(BUNDLED.rglob("*.py"))
    assert files
    found = [finding for path in files for finding in defeaters_in_source(str(path), path.read_text())]
    assert found == []
