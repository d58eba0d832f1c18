"""Options and helpers shared by the sub-commands.

Every mistake a user can make on the command line ends in one line on standard error
that names the problem and the fix, and exit status 2; never a traceback. The checks
that need no mesh run while the arguments are parsed (:class:`CliParser` and the
``type=`` functions here), so a command that would join a mesh refuses bad values before
it joins. What only the mesh can tell (nobody answered, the recipient is unknown) is exit
status 1. :data:`~porter_mesh.entrypoint.EXIT_CODES` is the table ``porter-mesh --help`` prints.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import math
import os
import pathlib
import secrets
import signal
import sys
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, NoReturn, TypeVar

from porter_mesh import eventloop
from porter_mesh.core import constants as C
from porter_mesh.core.advert import check_agent_name, check_mesh_name, seat_name
from porter_mesh.core.peers import PeerEvent
from porter_mesh.entrypoint import EXIT_CODES, EXIT_INTERRUPTED
from porter_mesh.errors import ConfigError
from porter_mesh.node.config import NodeConfig, data_root, split_seed

T = TypeVar("T")

def exit_code_table() -> str:
    """:data:`EXIT_CODES` as the text block of ``porter-mesh --help``."""
    lines = ["exit status:"]
    lines += [f"  {code:<4} {meaning}" for code, meaning in EXIT_CODES]
    return "\n".join(lines)


class CliParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line: the problem, then where help is."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}; see '{self.prog} --help'\n")


def _value_error(message: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(message)


def seconds(text: str) -> float:
    """An ``argparse`` type: a finite, non-negative number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise _value_error(f"{text!r} is not a number of seconds (e.g. 2 or 0.5)") from None
    if not math.isfinite(value) or value < 0:
        raise _value_error(f"{text!r} is not a number of seconds >= 0 (e.g. 2 or 0.5)")
    return value


def count(text: str) -> int:
    """An ``argparse`` type: a whole number >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise _value_error(f"{text!r} is not a whole number (e.g. 3)") from None
    if value < 0:
        raise _value_error(f"{text!r} is negative; give a whole number >= 0")
    return value


def agent_name(text: str) -> str:
    """An ``argparse`` type: a valid agent name."""
    try:
        return check_agent_name(text)
    except ConfigError as exc:
        raise _value_error(str(exc)) from None


def mesh_name(text: str) -> str:
    """An ``argparse`` type: a valid mesh name."""
    try:
        return check_mesh_name(text)
    except ConfigError as exc:
        raise _value_error(str(exc)) from None


def seed(text: str) -> str:
    """An ``argparse`` type: a seed peer ``[NAME@]HOST:PORT`` (a ROUTER port, 1-65535)."""
    try:
        split_seed(text)
    except ConfigError as exc:
        raise _value_error(str(exc)) from None
    return text


def interface(text: str) -> str:
    """An ``argparse`` type: an IP address to bind."""
    import ipaddress

    try:
        ipaddress.ip_address(text)
    except ValueError:
        raise _value_error(f"interface {text!r} is not an IP address; give the address to "
                           "bind, e.g. 127.0.0.1 or 192.168.1.20") from None
    return text


def checked_numbers(parser: argparse.ArgumentParser) -> None:
    """Make every plain ``float``/``int`` option of ``parser`` and its sub-commands
    refuse what no option of this CLI means: NaN, infinity and negative numbers.

    Every float option here is a duration and every int a count, port or limit; the
    sub-commands stay free to declare ``type=float`` and still get the check.
    """
    for action in parser._actions:
        if action.type is float:
            action.type = seconds
        elif action.type is int:
            action.type = count
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                checked_numbers(child)


#: The checks of the options every joining command shares, by destination.
_OPTION_TYPES: dict[str, Callable[[str], Any]] = {
    "name": agent_name, "mesh": mesh_name, "peers": seed, "interfaces": interface,
}


def checked_options(parser: argparse.ArgumentParser) -> None:
    """Give ``--name``, ``--mesh``, ``--peer`` and ``--interface`` of a parser built
    elsewhere (an agent's) the same checks as :func:`add_mesh_options`."""
    for action in parser._actions:
        check = _OPTION_TYPES.get(action.dest)
        if check is not None and action.option_strings and action.type is None:
            action.type = check


def add_mesh_options(parser: argparse.ArgumentParser) -> None:
    """``--mesh``, ``--interface`` (repeatable) and ``--peer`` (repeatable)."""
    parser.add_argument("--mesh", type=mesh_name,
                        default=os.environ.get("PORTER_MESH", C.DEFAULT_MESH),
                        help="mesh name (default: $PORTER_MESH or %(default)s)")
    parser.add_argument("--interface", action="append", dest="interfaces", metavar="IP",
                        type=interface,
                        help="address to bind and announce on (repeatable; default 127.0.0.1)")
    parser.add_argument("--peer", action="append", dest="peers", metavar="HOST:PORT",
                        type=seed, default=[],
                        help="static seed peer (its ROUTER port), for networks "
                        "without multicast (repeatable)")
    parser.add_argument("--no-discovery", action="store_true",
                        help="do not use zeroconf; rely on --peer seeds")
    parser.add_argument("--insecure", action="store_true",
                        help="allow binding beyond loopback without keys (protected mode "
                        "refuses it otherwise; see docs/security.md)")


def node_config(args: argparse.Namespace, **settings: Any) -> NodeConfig:
    """A :class:`NodeConfig` from the common options plus ``settings``."""
    if getattr(args, "insecure", False):
        settings["insecure"] = True
    return NodeConfig(
        mesh=args.mesh,
        interfaces=tuple(args.interfaces or ("127.0.0.1",)),
        seeds=tuple(args.peers),
        discovery=not args.no_discovery,
        **settings,
    )


#: The environment variable that sets the log level (DEBUG, INFO, WARNING, ERROR).
ENV_LOG = "PORTER_MESH_LOG"


def chosen_log_level(verbose: int) -> int | None:
    """The log level the user asked for: ``-v`` INFO, ``-vv`` DEBUG, or ``$PORTER_MESH_LOG``
    (the lower of the two); ``None`` when they asked for none."""
    levels = [logging.WARNING - 10 * min(verbose, 2)] if verbose > 0 else []
    named = os.environ.get(ENV_LOG, "").upper()
    if named in ("DEBUG", "INFO", "WARNING", "ERROR"):
        levels.append(getattr(logging, named))
    return min(levels) if levels else None


def quiet_node_logs(args: argparse.Namespace) -> None:
    """Keep a short-lived command's own node quiet unless the user asked for its logs.

    The node of a one-shot command (a seat, a ``peers`` or ``stats`` observer) is a
    means, not the result: what it meets on its way (a peer's late sync refused while the
    command closes its throw-away replica, say) is no news for the person reading the
    result. Its library logs show from ERROR up, unless ``-v`` or ``$PORTER_MESH_LOG``
    chose a level (see :func:`chosen_log_level`).
    """
    if chosen_log_level(getattr(args, "verbose", 0)) is None:
        logging.getLogger("porter_mesh").setLevel(logging.ERROR)


@functools.cache
def own_seat() -> str:
    """This process's seat name, ``porter-ui-<6 hex digits>``: chosen once, so that the
    activities a command builds before it joins name the node that sends them."""
    return seat_name(secrets.token_hex(3))


def seat_config(args: argparse.Namespace, **settings: Any) -> NodeConfig:
    """The short-lived seat of the human user for one command, named :func:`own_seat`.

    The seat never takes the dashboard's name ``porter-ui``: a name chosen by looking at
    the roster first would race with a dashboard or another command starting at the
    same moment, and two nodes of one name confuse every peer. Every seat's name is the
    human's all the same (:func:`~porter_mesh.core.advert.is_human`), and replies to it
    come back to it. It is not announced in mDNS (it introduces itself by hello to the
    peers it finds), and the nodes log its arrival and departure only at debug level (role
    :data:`~porter_mesh.core.constants.ROLE_SEAT`); they neither catch up from it nor
    compare knowledge digests with it.
    """
    settings.setdefault("channels", ())
    quiet_node_logs(args)
    return node_config(args, name=own_seat(), role=C.ROLE_SEAT, advertise=False,
                       **settings)


def refuse_negative(args: argparse.Namespace, *options: str) -> int | None:
    """Exit status 2, after a one-line complaint, when one of ``options`` (attribute
    names, e.g. ``"wait"``) is a negative number of seconds; else ``None``."""
    for option in options:
        value = getattr(args, option, None)
        if value is not None and value < 0:
            print(f"porter-mesh: --{option.replace('_', '-')} must be 0 or more seconds, "
                  f"not {value}", file=sys.stderr)
            return 2
    return None


def ephemeral_name(prefix: str) -> str:
    """A name for a short-lived observer process."""
    return f"{prefix}-{os.getpid()}"


def names(items: Iterable[str]) -> str:
    """``a, b and c`` for messages (``none`` when empty)."""
    items = sorted(items)
    if not items:
        return "none"
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " and " + items[-1]




def run(main: Callable[[], Awaitable[int]]) -> int:
    """Run ``main`` until it returns or SIGINT/SIGTERM arrives.

    Returns:
        ``main``'s status; :data:`EXIT_INTERRUPTED` when SIGINT (Ctrl-C) stopped it, so
        that a script can tell an interrupted command from one that finished; 0 when
        SIGTERM stopped it (the way a supervisor asks a long-running command to end).

    Errors are left to :func:`~porter_mesh.entrypoint.report_error` (the entry point
    calls it).
    """
    stopped_by: list[signal.Signals] = []

    async def runner() -> int:
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(main())

        def stop(sig: signal.Signals) -> None:
            stopped_by.append(sig)
            task.cancel()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop, sig)
        try:
            return await task
        except asyncio.CancelledError:
            return EXIT_INTERRUPTED if signal.SIGINT in stopped_by[:1] else 0

    return eventloop.run(runner())


def install_command(extra: str) -> str:
    """The command that installs the optional part ``extra`` (``mcp``...) where this
    ``porter-mesh`` runs: with its own interpreter (so into its virtualenv, whatever
    ``pip`` the shell finds first), and from the checkout when it runs from one (the
    project is not taken from a package index then).

    Args:
        extra: the name of the extra in ``pyproject.toml``.

    Returns:
        One shell command line.
    """
    import shlex

    checkout = pathlib.Path(__file__).resolve().parents[2]
    target = (f"{checkout}[{extra}]" if (checkout / "pyproject.toml").is_file()
              and (checkout / "porter_mesh").is_dir() else f"porter-mesh[{extra}]")
    editable = "-e " if target.startswith(str(checkout)) else ""
    return f"{shlex.quote(sys.executable)} -m pip install {editable}{shlex.quote(target)}"


def default_data_root() -> pathlib.Path:
    """Where nodes keep their data unless told otherwise."""
    return data_root()


def task_context(text: str) -> str:
    """An ``argparse`` type: a task id, ``urn:porter:task:<id>`` or just ``<id>``."""
    from porter_mesh.core.taskid import is_task_id

    value = text if text.startswith(C.TASK_URN_PREFIX) else C.TASK_URN_PREFIX + text
    if not is_task_id(value):
        raise _value_error(f"{text!r} is not a task id; give urn:porter:task:<id> or <id>, "
                           "with <id> made of letters, digits, '-' or '_'")
    return value


def channel_name(text: str) -> str:
    """An ``argparse`` type: a channel to send on (``log``, ``task``, ``task:<agent>``...)."""
    if text.startswith(C.DIRECT_PREFIX):
        try:
            check_agent_name(text[len(C.DIRECT_PREFIX):])
        except ConfigError as exc:
            raise _value_error(f"{text!r}: {exc}") from None
    elif not text or text == C.CHANNEL_CONTROL or any(c.isspace() for c in text):
        raise _value_error(
            f"{text!r} is not a channel to send on; use log, task, review or task:<agent>"
            + (" ('control' carries the mesh's own messages: use 'porter-mesh control')"
               if text == C.CHANNEL_CONTROL else ""))
    return text


#: The profile's channels a user sends on or watches, besides ``task:<agent>``.
PROFILE_CHANNELS = (C.CHANNEL_LOG, C.CHANNEL_TASK, C.CHANNEL_REVIEW)
#: The option that lets a channel outside the profile through.
ANY_CHANNEL = "--any-channel"


def add_any_channel_option(parser: argparse.ArgumentParser) -> None:
    """``--any-channel``: a channel outside the profile's set is meant, not misspelt."""
    parser.add_argument(ANY_CHANNEL, action="store_true",
                        help="allow a channel outside the profile's (log, task, "
                        "task:<agent>, review): one of your own, used on purpose")


def check_profile_channel(channel: str, *, allowed: Iterable[str] = ()) -> None:
    """Refuse a channel outside the profile's set: most likely a misspelling.

    Nobody subscribes to a channel of one's own invention, so a send to ``lgo`` would
    "succeed" to nobody; the user says it is deliberate with ``--any-channel``.

    Args:
        channel: the channel given.
        allowed: more channels the command accepts (``tail`` watches ``control`` too).

    Raises:
        ConfigError: not one of the profile's channels; the message lists them and
            suggests the close spelling.
    """
    known = (*PROFILE_CHANNELS, *allowed)
    if channel in known or channel.startswith(C.DIRECT_PREFIX):
        return
    import difflib

    close = difflib.get_close_matches(channel, known, n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ConfigError(f"{channel!r} is not a channel of the profile ({', '.join(known)} or "
                      f"task:<agent>); {hint}give {ANY_CHANNEL} to use it all the same")


def peer_event_line(event: PeerEvent, *, verbose: bool = False) -> str | None:
    """A roster change as a line for people, or None when it is not news: a command
    line's seat coming and going (shown with ``-v``)."""
    if event.peer.advert.role == C.ROLE_SEAT and not verbose:
        return None
    reason = f" ({event.reason})" if event.reason else ""
    return f"peer {event.peer.name} {event.kind.value}{reason}"
