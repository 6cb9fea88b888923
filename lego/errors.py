"""Every error Lego raises on purpose derives from LegoError and says what to do next."""


class LegoError(Exception):
    """Base class: the message tells the user what went wrong and how to fix it."""


class ConfigError(LegoError):
    """A config file or override is invalid."""


class DockerUnavailableError(LegoError):
    """No Docker engine is reachable and none could be started."""


class ImageBuildError(LegoError):
    """The sandbox base image or a task image could not be built."""


class TokenizerError(LegoError):
    """The tokenizer could not be obtained or failed its checksum."""


class ModelError(LegoError):
    """The policy checkpoint is missing or unusable."""


ERROR_TAIL_CHARS = 2000  # how much of a failing command's output or an error's text a message or record keeps


def tail(text: str, limit: int = ERROR_TAIL_CHARS) -> str:
    """The end of `text` (where a failing command says why), at most `limit` characters: the one cut used for
    error texts in messages, records and evidence."""
    return text[-limit:] if len(text) > limit else text
