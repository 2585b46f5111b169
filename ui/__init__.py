"""The read-only web viewer, `rolltap ui`: batches, rollouts, and one rollout at a glance."""

from .app import make_app
from .context import UIContext, UISettings
from .server import RunningUI, serve_until_stopped, start_ui

__all__ = ["RunningUI", "UIContext", "UISettings", "make_app", "serve_until_stopped", "start_ui"]
