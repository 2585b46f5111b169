"""The engines' own code for the contract tests: vLLM's and SGLang's request and response models
loaded from their wheels (.ci/setup-contract), or the reason they cannot be, and the rules by
which each engine drops a key it does not know.

vLLM's request models derive from `OpenAIBaseModel` (vllm/entrypoints/serve/engine/protocol.py):
`extra="allow"`, and a wrap validator that logs "The following fields were present in the
request but ignored" with `data.keys() - field names and aliases`, per model, nested ones
included. `vllm_ignored` runs that validator and collects what it logs: the wheel's own rule.

SGLang's package `__init__` imports triton (sglang/srt/utils/common.py), a GPU compiler with no CPU
wheel; the modules the contract needs do not, so they are loaded with the package's `__init__`
bypassed (a bare `sglang` package object over the installed directory). Its pydantic request
models keep pydantic's default `extra="ignore"`: an unknown key is dropped without a word;
`/generate` is checked by the generated JSON contract the server runs first
(sglang/api/v1/api_types.py) and then parsed into `GenerateReqInput`, a dataclass whose unknown
keys are dropped too. That dataclass lives in sglang/srt/managers/io_struct.py, which imports
torch-side modules (sglang.srt.utils -> triton; past SGLang's own triton stub, torchvision), so
its field names are read from the installed source with `ast`, as are those of
`UpdateWeightFromDiskReqInput`.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.metadata
import importlib.util
import logging
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VLLM = "0.33.0"
SGLANG = "0.5.23"
"""The versions .ci/setup-contract installs and the README names."""

SETUP = "run .ci/setup-contract to install the engines' wheels"


def installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def vllm_missing() -> str | None:
    """Why vLLM's modules cannot be used here; None when they can."""
    if installed("vllm") is None:
        return f"vllm is not installed: {SETUP}"
    try:
        importlib.import_module("vllm.entrypoints.openai.chat_completion.protocol")
        importlib.import_module("vllm.entrypoints.openai.completion.protocol")
        importlib.import_module("vllm.entrypoints.serve.tokenize.protocol")
    except ImportError as e:
        return f"vllm {installed('vllm')} does not import on CPU: {e}"
    return None


# -- vLLM's rule ---------------------------------------------------------------------------------

_VLLM_LOGGER = "vllm.entrypoints.serve.engine.protocol"


class _Ignored(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.keys: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        if "present in the request but ignored" in str(record.msg):
            assert isinstance(record.args, tuple)
            self.keys |= set(record.args[0])


@contextlib.contextmanager
def _vllm_ignored_log() -> Iterator[_Ignored]:
    logger = logging.getLogger(_VLLM_LOGGER)
    handler = _Ignored()
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def vllm_validate(model: Any, body: dict[str, Any]) -> tuple[Any, set[str]]:
    """`model.model_validate(body)` as vLLM's server runs it, and the keys vLLM logs as ignored
    (any level of nesting: each `OpenAIBaseModel` logs its own)."""
    with _vllm_ignored_log() as log:
        validated = model.model_validate(body)
    return validated, log.keys


# -- SGLang ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SGLang:
    version: str
    root: Path
    protocol: types.ModuleType
    """sglang.srt.entrypoints.openai.protocol: chat, completions, tokenize models."""
    api_types: types.ModuleType
    """sglang.api.v1.api_types: the generated /generate JSON contract."""

    def dataclass_fields(self, module: str, name: str) -> frozenset[str]:
        """The fields of a dataclass or msgspec Struct in SGLang's source, read with `ast` (with
        those of its base classes defined in the same file)."""
        path = self.root.joinpath(*module.split(".")[1:]).with_suffix(".py")
        classes = {
            node.name: node
            for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.ClassDef)
        }
        fields: set[str] = set()
        todo = [name]
        while todo:
            node = classes[todo.pop()]
            for statement in node.body:
                if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                    fields.add(statement.target.id)
            todo += [b.id for b in node.bases if isinstance(b, ast.Name) and b.id in classes]
        return frozenset(fields)


def sglang_version() -> str | None:
    return installed("sglang")


def sglang_modules() -> SGLang | str:
    """SGLang's protocol modules, or why they cannot be loaded here."""
    version = installed("sglang")
    if version is None:
        return f"sglang is not installed: {SETUP}"
    spec = importlib.util.find_spec("sglang")
    assert spec is not None
    assert spec.origin is not None
    root = Path(spec.origin).parent
    if "sglang" not in sys.modules:
        package = types.ModuleType("sglang")
        package.__path__ = [str(root)]
        package.__file__ = spec.origin
        sys.modules["sglang"] = package
    try:
        protocol = importlib.import_module("sglang.srt.entrypoints.openai.protocol")
        api_types = importlib.import_module("sglang.api.v1.api_types")
        importlib.import_module("sglang.srt.function_call.function_call_parser")
    except ImportError as e:
        return f"sglang {version}'s protocol modules do not import on CPU: {e}"
    return SGLang(version, root, protocol, api_types)


def pydantic_ignored(model: Any, data: Any, at: str = "") -> set[str]:
    """The keys of `data` a pydantic model validated from it dropped (pydantic's default
    `extra="ignore"`, SGLang's request models), nested models included, as dotted paths."""
    from pydantic import BaseModel

    if not isinstance(model, BaseModel) or not isinstance(data, dict):
        return set()
    known: dict[str, str] = {}
    for name, info in type(model).model_fields.items():
        known[name] = name
        if info.alias:
            known[info.alias] = name
        if isinstance(info.validation_alias, str):
            known[info.validation_alias] = name
    extra = (
        set(model.model_extra or {}) if type(model).model_config.get("extra") == "allow" else set()
    )
    ignored = {f"{at}{key}" for key in data if key not in known and key not in extra}
    for key, value in data.items():
        if key in known:
            ignored |= _nested(getattr(model, known[key], None), value, f"{at}{key}.")
    return ignored


def _nested(model: Any, value: Any, at: str) -> set[str]:
    if isinstance(model, list) and isinstance(value, list):
        found: set[str] = set()
        for k, (item, raw) in enumerate(zip(model, value, strict=False)):
            found |= pydantic_ignored(item, raw, f"{at}{k}.")
        return found
    return pydantic_ignored(model, value, at)
