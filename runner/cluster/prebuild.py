"""A node's task images, built before the node takes its first rollout.

Without it the first rollouts of each task on a node wait inside their INIT slot for a
`docker build` (tens of seconds to minutes for a real task), holding a `sandbox` unit the whole
time, and a batch whose tasks are all new starts by building every image at once on every
node. Built here, a few at a time, while Ray has not yet sent the node anything; rollouts then
find their image (runner/sandboxes/docker.py builds each tag once and reuses it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from ..rollout import KnowsTaskImages
from ..sandboxes.errors import ImageBuildError
from ..tasks import Task

log = logging.getLogger(__name__)

PARALLEL_BUILDS = 2
"""Builds at once on one node: each takes cores and the daemon's disk I/O, and the node's
sandboxes have not started yet, so two keep a small node busy without starving the daemon."""


async def prebuild(
    provider: object, tasks: Sequence[Task], parallel: int = PARALLEL_BUILDS
) -> dict[str, str]:
    """The image of each task that has one of its own, built or found, by task id. A task whose
    build fails is left out: its rollouts try again and record the build error as they always
    have, so one broken Dockerfile fails its task's rollouts, not the node."""
    if not isinstance(provider, KnowsTaskImages):
        return {}  # bwrap and apptainer run tasks on the node's own filesystem
    wanted = {t.id: t for t in tasks if t.environment.has_image}
    slots = asyncio.Semaphore(parallel)
    images: dict[str, str] = {}

    async def build(task: Task) -> None:
        async with slots:
            try:
                images[task.id] = await provider.task_image(task)
            except ImageBuildError as e:
                log.warning("pre-building %s failed; its rollouts will report it: %s", task.id, e)

    await asyncio.gather(*(build(t) for t in wanted.values()))
    return images
