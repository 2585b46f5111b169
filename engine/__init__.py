"""rolltap's built-in model backend: a transformers + torch engine behind vLLM's OpenAI dialect.

`rolltap model serve` runs it (serve.py); `launch.EngineProcess` runs it as a child process.
Importing this package loads neither torch nor transformers.
"""
