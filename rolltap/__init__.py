"""rolltap: token-faithful RL rollouts from unmodified agent harnesses."""

# The checkout's own rolltap/ folder shadows the installed package when Python runs from the
# repository root; extending __path__ lets rolltap.proxy/.store/.runner resolve either way.
from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)

__version__ = "0.1.0"
