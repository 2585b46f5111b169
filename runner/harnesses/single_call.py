"""single-call: the smallest real harness. It asks the model once (Chat Completions, the task's
instruction as the user message) and writes the answer to `answer.txt` in the workdir, where
the task's tests grade it. For short-answer tasks and RL loops on small models (a 135M model
never drives a multi-turn agent), run through the same sandboxes, proxy and verifier as every
harness. Part of rolltap: a standard-library script run with the sandbox's own `python3`, so
there is nothing to install and no harness image.
"""

from __future__ import annotations

from rolltap import __version__

from .base import (
    BuiltIn,
    Dialect,
    Ending,
    HarnessExit,
    Installation,
    Launch,
    Outcome,
    RunContext,
    base_env,
    exit_outcome,
    redact,
)

ANSWER_FILE = "answer.txt"
_HTTP_ERROR_EXIT = 3

SCRIPT = """
import json, os, pathlib, sys, urllib.error, urllib.request

instruction = pathlib.Path(sys.argv[1]).read_text()
body = {"model": os.environ["SINGLE_CALL_MODEL"],
        "messages": [{"role": "user", "content": instruction}]}
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
    headers={"Content-Type": "application/json",
             "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
try:
    with urllib.request.urlopen(request, timeout=3600) as response:
        reply = json.load(response)
except urllib.error.HTTPError as e:
    print(f"the model call failed: HTTP {e.code}: {e.read()[:500]!r}", file=sys.stderr)
    sys.exit(3)
pathlib.Path(os.environ["SINGLE_CALL_LOG"]).write_text(json.dumps(reply))
answer = reply["choices"][0]["message"].get("content") or ""
pathlib.Path(os.environ["SINGLE_CALL_ANSWER"]).write_text(answer)
print(answer)
"""


class SingleCall:
    name: str = "single-call"
    dialect: Dialect = "chat"
    packages: BuiltIn = BuiltIn()
    version: str = __version__

    def launch(self, ctx: RunContext, installation: Installation) -> Launch:
        script = ctx.home / "single_call.py"
        instruction = ctx.home / "instruction.txt"
        log = ctx.logs_dir / "reply.json"
        env = {
            **base_env(ctx, installation),
            "OPENAI_BASE_URL": ctx.openai_base_url,
            "OPENAI_API_KEY": ctx.key,
            "SINGLE_CALL_MODEL": ctx.model,
            "SINGLE_CALL_ANSWER": str(ctx.workdir / ANSWER_FILE),
            "SINGLE_CALL_LOG": str(log),
        }
        return Launch(
            argv=("python3", str(script), str(instruction)),
            env=env,
            cwd=ctx.workdir,
            files={script: SCRIPT, instruction: ctx.instruction},
            logs=(log,),
        )

    def classify(self, ctx: RunContext, exit: HarnessExit) -> Outcome:
        if exit.returncode == _HTTP_ERROR_EXIT:
            return Outcome(Ending.PROTOCOL_ERROR, redact(exit.stderr.strip()[-500:], ctx))
        return exit_outcome(ctx, exit)
