"""Coverage-guided fuzzing of the network decoders with atheris (optional; not part of
the test run).

Usage, from the repository root, once ``pip install atheris`` worked::

    .venv/bin/python -m tests.fuzz.fuzz_decoders -atheris_runs=200000
    .venv/bin/python -m tests.fuzz.fuzz_decoders --write-seeds corpus/   # valid inputs
    .venv/bin/python -m tests.fuzz.fuzz_decoders -max_total_time=600 corpus/

The first input byte picks a decoder (the table of
``tests/unit/test_fuzz_decoders.py``, plus the discovery TXT decoder); the rest is its
input. The property is the same as the hypothesis tests': a decoder returns, or raises
its own error with a countable reason, within the time bound. Anything else is a crash
that atheris reports with the input that caused it.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports(include=["porter_mesh"]):
    from porter_mesh.core.advert import decode_txt
    from tests.unit.test_fuzz_decoders import DECODERS, refused_cleanly

NAMES = [*sorted(DECODERS), "txt"]


def _txt(provider: atheris.FuzzedDataProvider) -> dict[bytes, bytes | None]:
    props: dict[bytes, bytes | None] = {}
    for _ in range(provider.ConsumeIntInRange(0, 16)):
        key = provider.ConsumeBytes(provider.ConsumeIntInRange(0, 12))
        props[key] = (None if provider.ConsumeBool()
                      else provider.ConsumeBytes(provider.ConsumeIntInRange(0, 300)))
    return props


def one_input(data: bytes) -> None:
    """Decode one fuzzer input; raise on a property violation."""
    provider = atheris.FuzzedDataProvider(data)
    name = NAMES[provider.ConsumeIntInRange(0, len(NAMES) - 1)]
    if name == "txt":
        props = _txt(provider)
        address = provider.ConsumeUnicodeNoSurrogates(40)
        refused_cleanly(name, props, lambda: decode_txt(props, addresses=[address]))
        return
    raw = provider.ConsumeBytes(provider.remaining_bytes())
    refused_cleanly(name, raw, lambda: DECODERS[name][0](raw))


def write_seeds(directory: str) -> None:
    """Write every valid encoding of the table as a starting corpus."""
    import pathlib

    out = pathlib.Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    for index, name in enumerate(NAMES[:-1]):
        for n, seed in enumerate(DECODERS[name][1]):
            # ConsumeIntInRange reads its byte from the end of the input.
            (out / f"{name}-{n}").write_bytes(seed + bytes([index]))


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--write-seeds":
        write_seeds(sys.argv[2])
        return
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
