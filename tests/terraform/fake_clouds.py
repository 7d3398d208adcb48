"""Stand-ins for the three clouds' CLIs (aws, gcloud, az), as far as Meridian uses their secret
stores: the clouds cannot be reached from here, so this is the one thing the tests mock.

Run as `fake_clouds.py aws|gcloud|az ARGS` (kit.fake_clouds puts those three on PATH), it
takes the real CLIs' arguments for reading and writing a secret, refuses any other, and keeps
the secrets as files under $FAKE_CLOUD_STORE. Every call's arguments are logged to
$FAKE_CLOUD_STORE/calls.log, so a test can check that no secret was ever on a command line.
$FAKE_CLOUD_FAIL makes the named CLI fail as the cloud would when the caller may not write.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path

STORE = Path(os.environ["FAKE_CLOUD_STORE"])


def _file(cloud: str, secret: str) -> Path:
    return STORE / f"{cloud}-{hashlib.sha256(secret.encode()).hexdigest()[:16]}"


def _read(cloud: str, secret: str, missing: str) -> None:
    path = _file(cloud, secret)
    if not path.exists():
        print(missing, file=sys.stderr)
        sys.exit(254 if cloud == "aws" else 1)
    print(path.read_text())


def _write(cloud: str, secret: str, value: str) -> None:
    if os.environ.get("FAKE_CLOUD_FAIL") == cloud:
        print(f"{cloud}: permission denied on {secret}", file=sys.stderr)
        sys.exit(1)
    _file(cloud, secret).write_text(value)


def aws(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="aws", exit_on_error=False)
    parser.add_argument("service", choices=["secretsmanager"])
    parser.add_argument("operation", choices=["get-secret-value", "put-secret-value"])
    parser.add_argument("--region", required=True)
    parser.add_argument("--secret-id", required=True)
    parser.add_argument("--query")
    parser.add_argument("--output", choices=["json", "text"])
    parser.add_argument("--secret-string")
    given = parser.parse_args(argv)
    if given.operation == "get-secret-value":
        assert (given.query, given.output) == ("SecretString", "text"), argv
        _read("aws", given.secret_id, "An error occurred (ResourceNotFoundException) when "
              "calling the GetSecretValue operation: Secrets Manager can't find the specified "
              "secret value for staging label: AWSCURRENT")  # fmt: skip
    else:
        assert given.secret_string.startswith("file://"), "the secret must come from a file"
        _write("aws", given.secret_id, Path(given.secret_string[7:]).read_text())


def gcloud(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="gcloud", exit_on_error=False)
    parser.add_argument("group", choices=["secrets"])
    parser.add_argument("sub", choices=["versions"])
    parser.add_argument("operation", choices=["access", "add"])
    parser.add_argument("target")
    parser.add_argument("--secret")
    parser.add_argument("--data-file")
    given = parser.parse_args(argv)
    if given.operation == "access":
        assert given.target == "latest", argv
        _read("gcp", given.secret, f"ERROR: (gcloud.secrets.versions.access) NOT_FOUND: "
              f"Secret [{given.secret}] not found or has no versions.")  # fmt: skip
    else:
        _write("gcp", given.target, Path(given.data_file).read_text())


def az(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="az", exit_on_error=False)
    parser.add_argument("group", choices=["keyvault"])
    parser.add_argument("sub", choices=["secret"])
    parser.add_argument("operation", choices=["show", "set"])
    parser.add_argument("--vault-name", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--query")
    parser.add_argument("--output", choices=["none", "tsv", "json"])
    parser.add_argument("--file")
    given = parser.parse_args(argv)
    secret = f"{given.vault_name}/{given.name}"
    if given.operation == "show":
        assert (given.query, given.output) == ("value", "tsv"), argv
        _read("azure", secret, f"ERROR: (SecretNotFound) A secret with (name/id) {given.name} "
              f"was not found in this key vault.")  # fmt: skip
    else:
        _write("azure", secret, Path(given.file).read_text())


def main() -> None:
    cli, argv = sys.argv[1], sys.argv[2:]
    with (STORE / "calls.log").open("a") as log:
        log.write(" ".join([cli, *argv]) + "\n")
    try:
        {"aws": aws, "gcloud": gcloud, "az": az}[cli](argv)
    except (argparse.ArgumentError, AssertionError) as error:
        print(f"{cli}: error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
