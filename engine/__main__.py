"""`python -m rolltap.engine [MODEL] [options]`: the same as `rolltap model serve`."""

from .command import serve

serve(prog_name="python -m rolltap.engine")
