"""What the chat formats refuse: messages or a template that cannot become a prompt.

Raised here as a plain ValueError of our own; the engine that serves the request turns it into
its HTTP error once, at its boundary (engine/core.py, Engine.render)."""

from __future__ import annotations


class Unrenderable(ValueError):
    """The messages (or the model's missing template) cannot be rendered; `param` names the
    request field at fault, as OpenAI's error bodies do."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
