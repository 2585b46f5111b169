"""The gate's per-request decision (runner/egress/rules.py) and the settings it is built from."""

from __future__ import annotations

from pathlib import Path

import pytest

from rolltap.runner.egress import BadEgressSetting, EgressMode, load_settings, sandbox_env
from rolltap.runner.egress.rules import (
    ALLOWED,
    DENIED,
    INTERCEPTED,
    PREAMBLE,
    decide,
    host_matches,
)
from rolltap.runner.sandboxes import forwarder


@pytest.mark.parametrize(
    ("host", "patterns", "matches"),
    [
        ("pypi.org", ("pypi.org",), True),
        ("PyPI.org.", ("pypi.org",), True),
        ("files.pythonhosted.org", ("*.pythonhosted.org",), True),
        ("pythonhosted.org", ("*.pythonhosted.org",), True),
        ("evilpythonhosted.org", ("*.pythonhosted.org",), False),
        ("pypi.org.evil.com", ("pypi.org",), False),
        ("github.com", (), False),
    ],
)
def test_host_patterns(host: str, patterns: tuple[str, ...], matches: bool) -> None:
    assert host_matches(host, patterns) is matches


def test_llm_hosts_are_intercepted_before_the_allow_list_and_only_when_intercepting() -> None:
    hosts = ("api.openai.com",)
    allow = ("api.openai.com",)
    assert decide("api.openai.com", allow=allow, intercept=hosts, intercepting=True).verdict == (
        INTERCEPTED
    )
    assert decide("api.openai.com", allow=allow, intercept=hosts, intercepting=False).verdict == (
        ALLOWED
    )
    refused = decide("api.openai.com", allow=(), intercept=hosts, intercepting=False)
    assert (refused.verdict, refused.reason) == (
        DENIED,
        "api.openai.com is not reachable: this rollout's allow-list is empty",
    )


def test_settings_merge_the_cli_and_a_config_file(tmp_path: Path) -> None:
    config = tmp_path / "egress.toml"
    config.write_text(
        'allow = ["*.pythonhosted.org"]\nintercept_hosts = ["llm.internal"]\n'
        '[resolve]\n"pypi.org" = "10.0.0.5:443"\n'
    )
    settings = load_settings("intercept", ["pypi.org"], config)
    assert settings.mode is EgressMode.INTERCEPT
    assert settings.allow == ("pypi.org", "*.pythonhosted.org")
    assert settings.intercept_hosts == ("llm.internal",)
    assert settings.resolve == {"pypi.org": "10.0.0.5:443"}
    assert not load_settings("none").enabled


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('allow = ["pypi.org/simple"]', "host pattern"),
        ("deny = []", "unknown keys"),
        ('[resolve]\n"pypi.org" = "somewhere"', "ADDRESS:PORT"),
        ('upstream_ca = "/nonexistent.pem"', "not a file"),
    ],
)
def test_bad_config_files_are_refused_naming_the_problem(
    tmp_path: Path, text: str, message: str
) -> None:
    config = tmp_path / "egress.toml"
    config.write_text(text + "\n")
    with pytest.raises(BadEgressSetting, match=message):
        load_settings("allowlist", (), config)


def test_the_sandbox_environment_names_the_bundle_for_every_runtime_and_exempts_loopback() -> None:
    env = sandbox_env("/run/rolltap/proxy/egress-ca.pem")
    assert env["HTTPS_PROXY"] == env["http_proxy"] == "http://127.0.0.1:43112"
    assert "127.0.0.1" in env["NO_PROXY"].split(",")
    for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS"):
        assert env[name] == env["CODEX_CA_CERTIFICATE"] == "/run/rolltap/proxy/egress-ca.pem"


def test_the_forwarder_opens_egress_connections_as_the_gate_expects() -> None:
    # forwarder.py runs inside sandboxes on their own Python: it cannot import rules.py.
    assert forwarder.EGRESS_PREAMBLE == PREAMBLE
