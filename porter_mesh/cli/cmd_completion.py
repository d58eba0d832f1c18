"""``porter-mesh completion bash|zsh``: print the shell's completion script.

The script (argcomplete's) asks ``porter-mesh`` itself what can come next, so it knows
every sub-command and option, new ones included, without being regenerated.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "completion", help="print the bash or zsh completion script",
        description="Print a completion script for SHELL. Load it in the current shell "
        "with: eval \"$(porter-mesh completion bash)\" (or zsh); add that line to "
        "~/.bashrc or ~/.zshrc to keep it.")
    parser.add_argument("shell", choices=("bash", "zsh"), metavar="SHELL",
                        help="bash or zsh")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from argcomplete.shell_integration import shellcode

    sys.stdout.write(shellcode(["porter-mesh"], shell=args.shell))
    return 0
