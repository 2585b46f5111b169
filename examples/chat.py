"""A short multi-turn chat through the rolltap proxy with the openai SDK, as a harness would.

    pip install openai                 # once: rolltap itself does not need the SDK
    rolltap serve                      # in one terminal: the proxy on the built-in engine
    python examples/chat.py            # in another; then: rolltap show <the rollout it prints>

It creates a rollout through the admin API, talks to the proxy at the rollout's base URL, and
prints what the store recorded for each turn.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request

try:
    import openai
    from openai.types.chat import ChatCompletionMessageParam
except ModuleNotFoundError as missing:
    if missing.name != "openai":
        raise
    sys.exit(
        "examples/chat.py talks to the proxy with the openai SDK, as a harness would: "
        "pip install openai"
    )


# The built-in engine's SmolLM2-135M answers this one in plain English; asked to be "a friendly
# assistant" instead, it drifted into French and repeated itself until max_tokens.
SYSTEM = "You are a helpful assistant. Answer in one short sentence."
QUESTIONS = ["What is the capital of France?", "And of Italy?", "Which language is spoken in Rome?"]
"""The last two lean on the turns before them, so the answers show the history reached the model."""


def create_rollout(proxy: str, admin_token: str | None) -> dict[str, str]:
    request = urllib.request.Request(
        f"{proxy}/admin/rollouts",
        data=json.dumps({"task_id": "chat-example"}).encode(),
        headers={"Content-Type": "application/json"}
        | ({"Authorization": f"Bearer {admin_token}"} if admin_token else {}),
    )
    try:
        with urllib.request.urlopen(request) as response:
            created: dict[str, str] = json.load(response)
    except urllib.error.HTTPError as e:  # before URLError: it is one
        hint = "; set ROLLTAP_ADMIN_TOKEN" if e.code == 401 else ""
        sys.exit(f"the proxy at {proxy} refused to create a rollout: HTTP {e.code}{hint}")
    except urllib.error.URLError as e:
        sys.exit(f"no rolltap proxy at {proxy} ({e.reason}): start one with `rolltap serve`")
    return created


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proxy", default="http://127.0.0.1:8100")
    parser.add_argument("--turns", type=int, default=3)
    args = parser.parse_args()

    rollout = create_rollout(args.proxy, os.environ.get("ROLLTAP_ADMIN_TOKEN"))
    client = openai.OpenAI(base_url=rollout["base_url"], api_key="unused")
    model = client.models.list().data[0].id
    messages: list[ChatCompletionMessageParam] = [{"role": "system", "content": SYSTEM}]
    for question in QUESTIONS[: args.turns]:
        messages.append({"role": "user", "content": question})
        reply = client.chat.completions.create(
            model=model, messages=messages, max_tokens=48, temperature=0
        )
        answer = reply.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": answer})
        print(f"> {question}\n{answer}\n")
    print(f"rollout {rollout['id']}: rolltap show {rollout['id']}")


if __name__ == "__main__":
    main()
