"""A harness that runs one shell script in the sandbox: a fake of the Harness Protocol for runner
tests and benchmarks. The script sees ROLLTAP_BASE_URL (the rollout's .../v1 through the proxy
forwarder), ROLLTAP_KEY and ROLLTAP_INSTRUCTION (the task's), and `python3 $ROLLTAP_ASK "prompt"`
makes one chat call with them.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from rolltap.runner.harnesses import Ending, HarnessExit, Installation, Launch, Outcome, RunContext
from rolltap.runner.harnesses.base import Dialect, PythonPackages

ASK = """
import json, os, sys, urllib.request
body = {"model": os.environ["ROLLTAP_MODEL"],
        "messages": [{"role": "user", "content": sys.argv[1]}], "max_tokens": 16}
request = urllib.request.Request(
    os.environ["ROLLTAP_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
    headers={"Content-Type": "application/json",
             "Authorization": "Bearer " + os.environ["ROLLTAP_KEY"]})
reply = json.load(urllib.request.urlopen(request, timeout=120))
print(reply["choices"][0]["message"]["content"])
"""


@dataclass(frozen=True)
class ShellHarness:
    script: str
    name: str = "shell"
    dialect: Dialect = "chat"
    packages: PythonPackages = field(default_factory=lambda: PythonPackages(requirements=()))

    def launch(self, ctx: RunContext, installation: Installation) -> Launch:
        ask = PurePosixPath(ctx.home) / "ask.py"
        return Launch(
            argv=("bash", "-c", self.script),
            env={
                "PATH": "/usr/local/bin:/usr/bin:/bin",
                "HOME": str(ctx.home),
                "ROLLTAP_BASE_URL": ctx.openai_base_url,
                "ROLLTAP_KEY": ctx.key,
                "ROLLTAP_MODEL": ctx.model,
                "ROLLTAP_ASK": str(ask),
                "ROLLTAP_INSTRUCTION": ctx.instruction,
            },
            cwd=ctx.workdir,
            files={ask: ASK},
        )

    def classify(self, ctx: RunContext, exit: HarnessExit) -> Outcome:
        if exit.returncode == 0:
            return Outcome(Ending.FINISHED)
        return Outcome(Ending.FAILED, f"exit {exit.returncode}")


def shell_installation() -> Installation:
    """An empty prefix: the shell harness needs nothing installed."""
    prefix = PurePosixPath(tempfile.mkdtemp(prefix="rolltap-shell-harness-"))
    return Installation(name="shell", prefix=prefix, bin_dir=prefix)


def cleanup(installation: Installation) -> None:
    Path(str(installation.prefix)).rmdir()
