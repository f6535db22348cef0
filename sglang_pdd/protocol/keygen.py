"""Every key file a deployment needs, made at once: `python -m sglang_pdd.protocol.keygen OUTDIR [--main NAME ...]`.

| file | what | who reads it, and how |
|---|---|---|
| `secret` | the token channel's shared secret (HMAC, signed PDD parameters) | every role and the router: `SGLANG_PDD_SECRET_FILE` |
| `role-api-key` | the key the router calls the roles with | the router: `SGLANG_PDD_ROLE_API_KEY_FILE` |
| `role-api-key.yaml` | the same key as sglang's config (`api-key: ...`) | P, RLD, MD: `--config FILE` (sglang's `--api-key`, off the command line) |
| `relay.key`, `relay.pub` | the relays' CURVE keypair (one per relay pool) | RLD: `SGLANG_PDD_TOKEN_CURVE_KEY_FILE=relay.key`; MD: `SGLANG_PDD_TOKEN_CURVE_KEY_FILE=relay.pub` |
| `NAME.key`, `NAME.pub` | a MainDecode pool's CURVE keypair (`--main NAME`, default `main`) | MD: `SGLANG_PDD_TOKEN_CURVE_CLIENT_KEY_FILE=NAME.key` |
| `curve-clients` | the MD public keys the relays admit | RLD: `SGLANG_PDD_TOKEN_CURVE_CLIENTS_FILE` |

Secrets are written 0600 in a 0700 directory, public keys 0644. Each site gets only what its roles read
(examples/kubernetes/README.md and examples/two-site-gpu/README.md say which). Nothing is overwritten:
an existing file is an error (new keys must reach every role at once), unless `--force`.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys

from sglang_pdd.protocol import curve

SECRET, ROLE_KEY, ROLE_CONFIG, RELAY, CLIENTS = "secret", "role-api-key", "role-api-key.yaml", "relay", "curve-clients"


def files(mains: list[str]) -> list[str]:
    """The names `write` makes, in order."""
    pairs = [f"{stem}.{ext}" for stem in (RELAY, *mains) for ext in ("key", "pub")]
    return [SECRET, ROLE_KEY, ROLE_CONFIG, *pairs, CLIENTS]


def write(outdir: str, mains: list[str], force: bool = False) -> list[str]:
    """Write every file of `files(mains)` into `outdir`; their paths."""
    bad = [m for m in mains if not m or os.path.basename(m) != m or m.startswith(".") or m == RELAY]
    if bad or len(set(mains)) != len(mains) or not mains:
        raise ValueError(f"--main: plain, distinct file names other than {RELAY!r}, got {mains}")
    there = [n for n in files(mains) if os.path.lexists(os.path.join(outdir, n))]
    if there and not force:
        raise FileExistsError(f"{outdir}: {', '.join(there)} exist already (new keys must reach every role at "
                              "once: --force to replace them)")
    os.makedirs(outdir, mode=0o700, exist_ok=True)
    role_key = secrets.token_hex(32)
    _write(outdir, SECRET, secrets.token_hex(32) + "\n", 0o600)
    _write(outdir, ROLE_KEY, role_key + "\n", 0o600)
    _write(outdir, ROLE_CONFIG, f'# sglang --config: the roles\' --api-key (the router holds {ROLE_KEY})\n'
                                f'api-key: "{role_key}"\n', 0o600)
    curve.write_pair(outdir, RELAY)
    publics = []
    for stem in mains:
        _, pub = curve.write_pair(outdir, stem)
        with open(pub) as f:
            publics.append(f"# {stem}\n{f.read().strip()}")  # a comment on its own line (load_clients)
    _write(outdir, CLIENTS, "# the MainDecode public keys the relays admit (SGLANG_PDD_TOKEN_CURVE_CLIENTS_FILE)\n"
                            + "".join(p + "\n" for p in publics), 0o644)
    return [os.path.join(outdir, n) for n in files(mains)]


def _write(outdir: str, name: str, text: str, mode: int) -> None:
    path = os.path.join(outdir, name)
    if os.path.lexists(path):
        os.unlink(path)  # a fresh file with this mode (O_CREAT keeps an old file's)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_pdd.protocol.keygen",
                                 description="Write every key file a PDD deployment needs (see the module's doc).")
    ap.add_argument("outdir", help="the directory to write them in (created 0700)")
    ap.add_argument("--main", action="append", metavar="NAME",
                    help="a MainDecode pool's keypair, NAME.key and NAME.pub, on the relays' list; may be repeated "
                         "(default: main)")
    ap.add_argument("--force", action="store_true", help="replace files that exist")
    args = ap.parse_args(argv)
    try:
        for path in write(args.outdir, args.main or ["main"], args.force):
            print(path)
    except (ValueError, FileExistsError) as e:
        print(f"keygen: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
