from iniconf import Config, dump, dumps, parse


def test_dumps_simple():
    cfg = Config({"a": {"x": "1", "y": "two"}})
    assert dumps(cfg) == "[a]\nx = 1\ny = two\n"


def test_dumps_default_first_and_not_repeated():
    cfg = Config({"DEFAULT": {"t": "1"}, "a": {"x": "2"}, "b": {"t": "3"}})
    assert dumps(cfg) == "[DEFAULT]\nt = 1\n\n[a]\nx = 2\n\n[b]\nt = 3\n"


def test_round_trip_keeps_comment_markers():
    cfg = Config({"a": {"note": "keep ; this", "pad": "  spaced  "}})
    assert parse(dumps(cfg)) == {"a": {"note": "keep ; this", "pad": "  spaced  "}}


def test_empty_config():
    assert dumps(Config()) == ""


def test_dump_to_file(tmp_path):
    path = tmp_path / "out.ini"
    dump(Config({"a": {"x": "1"}}), path)
    assert Config.from_file(path).get("a", "x") == "1"
