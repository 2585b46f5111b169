"""What sandboxes raise.

SandboxError
 ├── SandboxUnavailable   this kind cannot run on this machine (binary missing, no daemon)
 ├── SandboxStartError    one sandbox failed to start; retrying may succeed
 │    └── ImageBuildError the task's image could not be built or found; retrying will not help
 ├── SetupFailed          the task's setup script failed or timed out in a fresh sandbox
 ├── SandboxExecError     a command could not be run at all (not: it ran and failed)
 └── SandboxCopyError     a file could not be copied into or out of the sandbox
"""

from __future__ import annotations


class SandboxError(Exception):
    pass


class SandboxUnavailable(SandboxError):
    pass


class SandboxStartError(SandboxError):
    pass


class ImageBuildError(SandboxStartError):
    pass


class SetupFailed(SandboxError):
    pass


class SandboxExecError(SandboxError):
    pass


class SandboxCopyError(SandboxError):
    pass
