import pytest

from iniconf import Config, InterpolationError, NoOptionError

TEXT = """
[DEFAULT]
timeout = 30

[server]
host = example.org
port = 8080
debug = yes
ratio = 0.75
tags = web, api,
    internal

[client]
timeout = 5
url = http://${server:host}:${server:port}/
"""


@pytest.fixture
def cfg():
    return Config.from_string(TEXT)


def test_sections_exclude_default(cfg):
    assert cfg.sections() == ["server", "client"]


def test_default_fallback(cfg):
    assert cfg.get("server", "timeout") == "30"
    assert cfg.get("client", "timeout") == "5"
    assert "timeout" in cfg.options("server")


def test_missing_option(cfg):
    with pytest.raises(NoOptionError, match="no option 'nope' in section \\[server\\]"):
        cfg.get("server", "nope")
    assert cfg.get("server", "nope", fallback=None) is None


def test_typed_getters(cfg):
    assert cfg.getint("server", "port") == 8080
    assert cfg.getfloat("server", "ratio") == 0.75
    assert cfg.getbool("server", "debug") is True
    assert cfg.getint("server", "missing", fallback=1) == 1


def test_getbool_rejects_other_words(cfg):
    cfg.set("server", "debug", "maybe")
    with pytest.raises(ValueError, match="not a boolean"):
        cfg.getbool("server", "debug")


def test_getlist(cfg):
    assert cfg.getlist("server", "tags") == ["web", "api", "internal"]


def test_interpolation(cfg):
    assert cfg.get("client", "url") == "http://example.org:8080/"
    assert cfg.get("client", "url", raw=True) == "http://${server:host}:${server:port}/"


def test_interpolation_missing_reference(cfg):
    cfg.set("client", "bad", "${server:nothing}")
    with pytest.raises(InterpolationError, match="does not exist"):
        cfg.get("client", "bad")


def test_set_and_remove(cfg):
    cfg.set("new", "Key", "v")
    assert cfg.get("new", "key") == "v"
    assert cfg.remove_option("new", "KEY") is True
    assert cfg.remove_option("new", "key") is False


def test_set_requires_strings(cfg):
    with pytest.raises(TypeError):
        cfg.set("server", "port", 8080)


def test_to_dict(cfg):
    assert cfg.to_dict()["client"] == {"timeout": "5", "url": "http://example.org:8080/"}
