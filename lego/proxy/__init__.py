"""In-process OpenAI + Anthropic + Responses server; sessions; token accumulation; tool-call parsing."""

from lego.proxy.messages import ContextOverflowError, RequestError
from lego.proxy.server import ProxyServer
from lego.proxy.session import Session

__all__ = ["ContextOverflowError", "ProxyServer", "RequestError", "Session"]
