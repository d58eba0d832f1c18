"""CurveZMQ for a mesh: keys, the directory of trusted keys, ZAP and the audit log.

Theory of operation
-------------------
A secured mesh encrypts and authenticates every connection with CurveZMQ. Each agent
owns a key pair in the standard ZeroMQ certificate format (``NAME.key`` holds the
public key, ``NAME.key_secret`` both keys; the secret file is readable by its owner
only). Each mesh has a **trusted directory** of public certificates: a key is allowed on
the mesh when its certificate is in that directory, and the file name binds it to one
agent name (``worker-1.key`` is the key of ``worker-1`` and of nobody else). The file
name was chosen over certificate metadata because pyzmq writes metadata into the secret
certificate only, and because ``ls trusted/`` then shows at a glance who may join.

Every node is a CURVE *server* on the sockets it binds (XPUB, ROUTER) and a CURVE
*client* on the sockets it connects (one SUB and one DEALER per peer), with the peer's
public key from its advert as the server key. libzmq sets the server key per socket, so a
secured node cannot share one SUB among publishers that hold different keys; it keeps
one SUB per peer instead. A client that knows the server key is sure to talk to the
holder of the matching secret key, so whatever arrives on a peer's SUB or DEALER comes
from that peer.

Servers ask pyzmq's ZAP authenticator (:class:`MeshAuthenticator`, driven by the node's
event loop) about every new connection. Its credentials callback consults a
:class:`TrustStore`, which re-reads the directory whenever the directory or one of its
files changed (a ``stat`` per handshake, not a one-time load), so adding or removing a key
takes effect for the next connection without a restart. (Connections already open when
a key leaves the directory are cut by the node within one heartbeat, see
:mod:`porter_mesh.node.node`: its live link is closed and its PUB socket bound anew.)
An accepted connection carries the bound agent name as its ZAP User-Id, which libzmq
attaches to every message read from it; the node compares that name with the envelope's
sender and each activity's ``actor`` (see :mod:`porter_mesh.node.node`). The
authenticator must be running before a server socket binds: libzmq lets a CURVE client in
unauthenticated when no ZAP handler answers, so :meth:`MeshSecurity.start` also sets
``ZAP_ENFORCE_DOMAIN`` where libzmq supports it.

**Record signatures.** CurveZMQ proves who is on the other end of a connection, not who
wrote what that peer relays. Knowledge records travel further than one hop (a catch-up
from one peer brings everybody's records), so each agent also owns an Ed25519 *signing
key*, made by ``keygen`` beside the CURVE key and written into the same certificates:
``signing-key`` (public) in the metadata of both files, ``signing-secret-key`` in the
secret one only. Trusting an agent's public certificate therefore trusts its signing key
under the same name, with nothing more to copy. :class:`RecordSigner` signs this node's
records; :class:`RecordVerifier` checks anyone's against the trusted directory.
``keygen NAME --add-signing-key`` gives a key pair made before signing keys existed one,
keeping its CURVE key.

Refusals and spoofing attempts go to the :class:`AuditLog`: a JSON-lines file in the
node's data directory (when it has one), a counter per event (``audit.<event>``) and a
warning the first time. Repeats of one event from one subject are written a few times,
then only counted, so a hostile peer cannot fill the disk.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import logging
import os
import pathlib
import re
import stat
import tempfile
from dataclasses import dataclass, field
from typing import Any, Final

import orjson
import zmq
from zmq.auth import Authenticator, load_certificate

from porter_mesh.core.advert import PeerAdvert, check_agent_name, key_name
from porter_mesh.errors import SecurityError

__all__ = [
    "AUDIT_FILE",
    "MIN_LIBZMQ",
    "AuditLog",
    "Identity",
    "MeshAuthenticator",
    "MeshSecurity",
    "RecordSigner",
    "RecordVerifier",
    "TrustStore",
    "add_signing_key",
    "check_libzmq",
    "create_key_pair",
    "load_identity",
    "provision_mesh",
    "trust_key",
]

log = logging.getLogger("porter_mesh.security")

#: libzmq releases before 4.3.2 have remotely exploitable bugs (CVE-2019-6250 and
#: CVE-2019-13132); a node refuses to run on them.
MIN_LIBZMQ: Final = (4, 3, 2)
#: Name of the audit log inside a node's data directory.
AUDIT_FILE: Final = "audit.jsonl"
#: Public certificates in the trusted directory end with this suffix.
PUBLIC_SUFFIX: Final = ".key"
SECRET_SUFFIX: Final = ".key_secret"
#: A certificate is a few hundred bytes; anything much larger is not one.
_MAX_CERT_BYTES: Final = 64 * 1024
#: Most seconds between two full reads of a trusted directory whose own status did not
#: change (see TrustStore.refresh_if_changed).
RESCAN_EVERY: Final = 5.0
_Z85_KEY_RE: Final = re.compile(rb"[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}")
_METADATA_NAME_RE: Final = re.compile(rb"^\s+name\s*=\s*\"?([^\"\s]+)\"?\s*$", re.MULTILINE)
_SIGNING_PUBLIC_RE: Final = re.compile(rb"^\s+signing-key\s*=\s*\"?([^\"\s]*)\"?\s*$",
                                       re.MULTILINE)
_SIGNING_SECRET_RE: Final = re.compile(
    rb"^\s+signing-secret-key\s*=\s*\"?([^\"\s]*)\"?\s*$", re.MULTILINE)
#: Audit lines written per (event, subject) before further ones are only counted.
_AUDIT_REPEATS: Final = 10
_AUDIT_SUBJECTS: Final = 10_000


def check_libzmq(version: tuple[int, int, int] | None = None) -> None:
    """Refuse a libzmq that is too old, or one built without CURVE.

    Args:
        version: the version to check (default: the libzmq pyzmq is linked with).

    Raises:
        SecurityError: the version is older than :data:`MIN_LIBZMQ`.
    """
    found = version if version is not None else zmq.zmq_version_info()
    if tuple(found) < MIN_LIBZMQ:
        have = ".".join(map(str, found))
        need = ".".join(map(str, MIN_LIBZMQ))
        raise SecurityError(
            f"libzmq {have} is too old: versions before {need} have remotely exploitable "
            f"bugs; upgrade pyzmq (pip install -U pyzmq bundles a current libzmq)"
        )


def _valid_key(key: bytes | None) -> bool:
    return key is not None and _Z85_KEY_RE.fullmatch(key) is not None


def _read_cert(path: pathlib.Path) -> tuple[bytes, bytes | None, bytes]:
    """``(public, secret or None, raw text)`` of a certificate file.

    Raises:
        SecurityError: the file cannot be read or holds no valid public key.
    """
    try:
        size = path.stat().st_size
        if size > _MAX_CERT_BYTES:
            raise SecurityError(f"{path} is {size} bytes: not a ZeroMQ certificate")
        raw = path.read_bytes()
        public, secret = load_certificate(path)
    except (OSError, ValueError) as exc:
        raise SecurityError(f"cannot read the certificate {path}: {exc}") from None
    if not _valid_key(public) or (secret is not None and not _valid_key(secret)):
        raise SecurityError(f"{path} does not hold a 40-character Z85 CurveZMQ key")
    return public, secret, raw


def _metadata(raw: bytes) -> bytes:
    """The part of a certificate before its ``curve`` section."""
    return raw.split(b"\ncurve", 1)[0]


def _signing_keys(raw: bytes, path: pathlib.Path) -> tuple[bytes | None, bytes | None]:
    """``(public, secret)`` Ed25519 signing keys (32 raw bytes each) of a certificate.

    Raises:
        SecurityError: a signing key is there but is not 40 characters of Z85.
    """
    meta = _metadata(raw)
    found: list[bytes | None] = []
    for pattern, what in ((_SIGNING_PUBLIC_RE, "signing-key"),
                          (_SIGNING_SECRET_RE, "signing-secret-key")):
        match = pattern.search(meta)
        if match is None:
            found.append(None)
            continue
        if not _valid_key(match.group(1)):
            raise SecurityError(f"{path}: {what} is not a 40-character Z85 key; make a new "
                                "key pair with 'porter-mesh keygen NAME --force'")
        found.append(zmq.utils.z85.decode(match.group(1)))
    return found[0], found[1]


def _signing_public_of(secret: bytes) -> bytes:
    """The Ed25519 public key of a 32-byte private key."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.from_private_bytes(secret).public_key().public_bytes_raw()


def _new_signing_key() -> tuple[bytes, bytes]:
    """A fresh Ed25519 key pair: ``(public, secret)``, 32 raw bytes each."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    return key.public_key().public_bytes_raw(), key.private_bytes_raw()


@dataclass(frozen=True, slots=True)
class Identity:
    """This node's key pair, loaded from its secret certificate.

    Attributes:
        public_key: Z85 public key (40 characters), announced in the advert.
        secret_key: Z85 secret key; never logged or shown.
        name: the agent name written in the certificate's metadata, if any.
        path: the certificate file.
        signing_public: the Ed25519 public key records are checked with (32 bytes), or
            ``None`` for a key pair made before signing keys existed.
        signing_secret: the Ed25519 private key this node signs its records with (32
            bytes); never logged or shown.
    """

    public_key: str
    secret_key: bytes = field(repr=False)
    name: str | None
    path: pathlib.Path
    signing_public: bytes | None = None
    signing_secret: bytes | None = field(default=None, repr=False)

    @property
    def signing_key_z85(self) -> str | None:
        """The public signing key as Z85 text (what adverts carry), or None."""
        if self.signing_public is None:
            return None
        return zmq.utils.z85.encode(self.signing_public).decode("ascii")


def load_identity(path: pathlib.Path) -> Identity:
    """Load a secret certificate made by ``porter-mesh keygen``.

    Args:
        path: the ``NAME.key_secret`` file.

    Returns:
        The node's identity.

    Raises:
        SecurityError: the file is missing, readable by others than its owner, or holds
            no secret key.
    """
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise SecurityError(
            f"cannot read the secret key {path}: {exc.strerror}; make one with "
            "'porter-mesh keygen NAME'"
        ) from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SecurityError(
            f"the secret key {path} is accessible to other users (mode "
            f"{stat.S_IMODE(mode):o}); run 'chmod 600 {path}' (and make a new key pair if "
            "others may have read it)"
        )
    public, secret, raw = _read_cert(path)
    if secret is None:
        raise SecurityError(
            f"{path} holds only a public key; give the .key_secret file of this agent"
        )
    match = _METADATA_NAME_RE.search(_metadata(raw))
    name = match.group(1).decode("utf-8", "replace") if match else None
    signing_public, signing_secret = _signing_keys(raw, path)
    if signing_secret is not None and _signing_public_of(signing_secret) != signing_public:
        raise SecurityError(
            f"{path}: its signing-key does not belong to its signing-secret-key (the file "
            "was edited); make a new key pair with 'porter-mesh keygen NAME --force'"
        )
    return Identity(public.decode("ascii"), secret, name, path, signing_public,
                    signing_secret)


_PUBLIC_BANNER: Final = """#   ****  Generated on {now} by porter-mesh  ****
#   ZeroMQ CURVE Public Certificate, with the agent's Ed25519 key that signs its
#   knowledge records. Exchange securely, or use a secure mechanism to verify
#   the contents of this file after exchange.

"""
_SECRET_BANNER: Final = """#   ****  Generated on {now} by porter-mesh  ****
#   ZeroMQ CURVE **Secret** Certificate, with the agent's Ed25519 signing key.
#   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions.

"""


def _cert_text(name: str, curve: tuple[bytes, bytes | None],
               signing: tuple[bytes, bytes | None]) -> str:
    """A certificate in ZeroMQ's format; the secret one when the secret keys are given.

    The signing keys are metadata, which ZeroMQ tools skip, so the files stay standard.
    """
    z85 = zmq.utils.z85.encode
    secret = curve[1] is not None
    now = datetime.datetime.now().isoformat(timespec="seconds")
    lines = [(_SECRET_BANNER if secret else _PUBLIC_BANNER).format(now=now), "metadata\n",
             f'    name = "{name}"\n',
             f'    signing-key = "{z85(signing[0]).decode()}"\n']
    if secret and signing[1] is not None:
        lines.append(f'    signing-secret-key = "{z85(signing[1]).decode()}"\n')
    lines += ["curve\n", f'    public-key = "{curve[0].decode()}"\n']
    if curve[1] is not None:
        lines.append(f'    secret-key = "{curve[1].decode()}"\n')
    return "".join(lines)


def _write_pair(directory: pathlib.Path, name: str, curve: tuple[bytes, bytes],
                signing: tuple[bytes, bytes]) -> tuple[pathlib.Path, pathlib.Path]:
    """Write ``NAME.key`` and ``NAME.key_secret``, secret file private from the start.

    The files are first written into a private temporary directory and then moved into
    place, so the secret key is never readable by others, not even for a moment.

    Raises:
        SecurityError: the files cannot be written.
    """
    public = directory / f"{name}{PUBLIC_SUFFIX}"
    secret = directory / f"{name}{SECRET_SUFFIX}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=directory, prefix=".keygen-") as tmp:
            made_secret = pathlib.Path(tmp) / secret.name
            made_public = pathlib.Path(tmp) / public.name
            made_secret.write_text(_cert_text(name, curve, signing))
            os.chmod(made_secret, 0o600)
            made_public.write_text(_cert_text(name, (curve[0], None), (signing[0], None)))
            os.chmod(made_public, 0o644)
            os.replace(made_secret, secret)
            os.replace(made_public, public)
    except OSError as exc:
        raise SecurityError(f"cannot write a key pair into {directory}: {exc}") from None
    return public, secret


def create_key_pair(directory: pathlib.Path, name: str, *, force: bool = False
                    ) -> tuple[pathlib.Path, pathlib.Path]:
    """Write a new key pair for agent ``name``: ``NAME.key`` and ``NAME.key_secret``.

    Each holds the CurveZMQ key and the Ed25519 key that signs the agent's knowledge
    records (see the module docstring); the secret file is mode 600 from the start.

    Args:
        directory: where to write the two files (made if missing).
        name: the agent name (recorded in both certificates' metadata).
        force: replace an existing key pair of that name.

    Returns:
        ``(public certificate, secret certificate)`` paths.

    Raises:
        ConfigError: ``name`` is not a valid agent name.
        SecurityError: the files exist (without ``force``) or cannot be written.
    """
    check_agent_name(name)
    public = directory / f"{name}{PUBLIC_SUFFIX}"
    secret = directory / f"{name}{SECRET_SUFFIX}"
    if not force and (public.exists() or secret.exists()):
        raise SecurityError(
            f"a key pair for {name!r} already exists in {directory}; keep it, or pass "
            "--force to replace it (peers that trust the old key must then be updated)"
        )
    curve_public, curve_secret = zmq.curve_keypair()
    return _write_pair(directory, name, (curve_public, curve_secret), _new_signing_key())


def add_signing_key(directory: pathlib.Path, name: str) -> tuple[pathlib.Path, pathlib.Path]:
    """Give an existing key pair made without a signing key one, keeping its CURVE key.

    Args:
        directory: where ``NAME.key`` and ``NAME.key_secret`` are.
        name: the agent name.

    Returns:
        ``(public certificate, secret certificate)`` paths, rewritten.

    Raises:
        ConfigError: ``name`` is not a valid agent name.
        SecurityError: there is no such key pair, or it already has a signing key.
    """
    check_agent_name(name)
    identity = load_identity(directory / f"{name}{SECRET_SUFFIX}")
    if identity.signing_secret is not None:
        raise SecurityError(f"the key pair of {name!r} in {directory} already has a signing "
                            "key; nothing to do")
    curve = (identity.public_key.encode("ascii"), identity.secret_key)
    return _write_pair(directory, name, curve, _new_signing_key())


def trust_key(cert: pathlib.Path, trusted_dir: pathlib.Path, *, name: str | None = None,
              force: bool = False) -> pathlib.Path:
    """Add a public certificate to a mesh's trusted directory, bound to an agent name.

    Args:
        cert: a public certificate (``NAME.key``, as written by ``keygen``).
        trusted_dir: the mesh's trusted directory (made if missing).
        name: the agent name to bind the key to (default: the file name without ``.key``).
        force: replace a different key already trusted under that name.

    Returns:
        The path of the certificate in the trusted directory.

    Raises:
        ConfigError: the name is not a valid agent name.
        SecurityError: the file holds a secret key or no valid key; the name is bound to
            another key (without ``force``); or the key is already trusted under another
            name (one key, one agent).
    """
    public, secret, raw = _read_cert(cert)
    if secret is not None:
        raise SecurityError(
            f"{cert} contains a secret key; trust the public certificate (the .key file) "
            "instead: a secret key never leaves the agent that owns it"
        )
    agent = name if name is not None else cert.name.removesuffix(PUBLIC_SUFFIX)
    check_agent_name(agent)
    store = TrustStore(trusted_dir)
    store.refresh()
    key = public.decode("ascii")
    holder = store.name_for(key)
    if holder is not None and holder != agent:
        raise SecurityError(
            f"this key is already trusted as {holder!r}; one key belongs to one agent "
            f"(remove {trusted_dir / (holder + PUBLIC_SUFFIX)} first to rename it)"
        )
    current = store.key_for(agent)
    if current is not None and current != key and not force:
        raise SecurityError(
            f"{agent!r} is already trusted with another key; pass --force to replace it"
        )
    target = trusted_dir / f"{agent}{PUBLIC_SUFFIX}"
    try:
        trusted_dir.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_bytes(raw)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)  # atomic: a reader sees the old file or the new one
    except OSError as exc:
        raise SecurityError(f"cannot write into {trusted_dir}: {exc}") from None
    return target


def provision_mesh(directory: pathlib.Path, names: list[str] | tuple[str, ...]
                   ) -> tuple[pathlib.Path, dict[str, pathlib.Path]]:
    """Make a key pair for each agent and trust them all: a self-contained secured mesh
    (for the demo, benchmarks and tests; a lab does the same with ``keygen`` and
    ``trust``, see ``docs/security.md``).

    Args:
        directory: where the key pairs go; the trusted directory is its ``trusted``.
        names: the agents.

    Returns:
        ``(trusted directory, {name: secret certificate})``.

    Raises:
        SecurityError: a file cannot be written, or a key pair already exists there.
    """
    trusted = directory / "trusted"
    secrets: dict[str, pathlib.Path] = {}
    for name in names:
        public, secrets[name] = create_key_pair(directory, name)
        trust_key(public, trusted)
    return trusted, secrets


class TrustStore:
    """The trusted directory of one mesh, re-read whenever it changes.

    Args:
        directory: the directory of public certificates (``NAME.key``).

    A key listed under two names is trusted under neither (it is ambiguous), and files
    that are not certificates are skipped with a warning; neither stops the others from
    loading.
    """

    def __init__(self, directory: pathlib.Path) -> None:
        self.directory = directory
        #: Increases every time the set of trusted keys changes.
        self.generation = 0
        #: Increases every time a change takes a key out of the set (a revocation, or a
        #: key replaced under its name): connections that hold it must be cut.
        self.removals = 0
        self._signature: tuple[Any, ...] | None = None
        self._by_key: dict[str, str] = {}
        self._by_name: dict[str, str] = {}
        self._signing: dict[str, bytes] = {}
        self._warned: set[str] = set()
        # The directory's own status at the last look, and when every file is next
        # looked at again all the same (see refresh_if_changed).
        self._dir_stat: tuple[int, int, int] | None = None
        self._rescan_at = 0.0

    @property
    def names(self) -> frozenset[str]:
        """Agent names that currently have a trusted key."""
        return frozenset(self._by_name)

    def trusts(self, name: str) -> bool:
        """True when agent ``name`` has a trusted key (cheap: no copy of the set)."""
        return name in self._by_name

    def name_for(self, key: str) -> str | None:
        """The agent a Z85 public key is bound to, or None when it is not trusted."""
        return self._by_key.get(key)

    def key_for(self, name: str) -> str | None:
        """The trusted Z85 public key of agent ``name``, or None."""
        return self._by_name.get(name)

    def signing_key_for(self, name: str) -> bytes | None:
        """The trusted Ed25519 signing key (32 bytes) of agent ``name``, or None when it
        is not trusted or its certificate has no signing key."""
        return self._signing.get(name)

    def _scan(self) -> tuple[Any, ...]:
        entries: list[tuple[str, int, int, int]] = []
        try:
            with os.scandir(self.directory) as it:
                for entry in it:
                    if entry.name.endswith(PUBLIC_SUFFIX) and not entry.name.startswith("."):
                        st = entry.stat()
                        entries.append((entry.name, st.st_mtime_ns, st.st_size, st.st_ino))
        except FileNotFoundError:
            return ("missing",)
        return tuple(sorted(entries))

    def _dir_status(self) -> tuple[int, int, int]:
        try:
            st = os.stat(self.directory)
        except OSError:
            return (-1, -1, -1)
        return (st.st_mtime_ns, st.st_ino, st.st_nlink)

    def refresh_if_changed(self, now: float, *, rescan_every: float = RESCAN_EVERY) -> bool:
        """A cheap look, for a caller that looks often (a node, once a heartbeat).

        One ``stat`` of the directory: adding, removing or renaming a key changes its
        modification time, and then (or every ``rescan_every`` seconds all the same,
        which catches a certificate rewritten in place) the directory is re-read as
        :meth:`refresh` does.

        Args:
            now: monotonic seconds.
            rescan_every: most seconds between two full looks.

        Returns:
            True when the set of trusted keys was reloaded.
        """
        if self._dir_status() == self._dir_stat and now < self._rescan_at:
            return False
        self._rescan_at = now + rescan_every
        return self.refresh()

    def refresh(self) -> bool:
        """Re-read the directory if it changed since the last look.

        Returns:
            True when the set of trusted keys was reloaded.
        """
        # Before the scan: a change made during it shows in the next look's status.
        self._dir_stat = self._dir_status()
        signature = self._scan()
        if signature == self._signature:
            return False
        self._signature = signature
        found: list[tuple[str, str]] = []
        signing_found: dict[str, bytes] = {}
        for item in signature:
            if not isinstance(item, tuple):
                continue
            filename = item[0]
            path = self.directory / filename
            agent = filename.removesuffix(PUBLIC_SUFFIX)
            try:
                check_agent_name(agent)
                public, _, raw = _read_cert(path)
                signing, _ = _signing_keys(raw, path)
            except Exception as exc:  # a stray file must not hide the good ones
                self._warn(filename, "skipping %s in the trusted directory: %s", path, exc)
                continue
            found.append((agent, public.decode("ascii")))
            if signing is not None:
                signing_found[agent] = signing
        uses = collections.Counter(key for _, key in found)
        by_key: dict[str, str] = {}
        by_name: dict[str, str] = {}
        for agent, key in found:
            if uses[key] > 1:
                self._warn(agent + PUBLIC_SUFFIX, "the key of %s in %s is trusted under "
                           "several names; trusting it under none", agent, self.directory)
                continue
            by_key[key] = agent
            by_name[agent] = key
        signing_keys = {a: k for a, k in signing_found.items() if a in by_name}
        changed = by_key != self._by_key or signing_keys != self._signing
        if not self._by_key.keys() <= by_key.keys() or any(
                by_key[key] != name for key, name in self._by_key.items() if key in by_key):
            self.removals += 1
        self._by_key, self._by_name, self._signing = by_key, by_name, signing_keys
        if changed:
            self.generation += 1
        return changed

    def _warn(self, filename: str, message: str, *args: object) -> None:
        if filename not in self._warned and len(self._warned) < 1000:
            self._warned.add(filename)
            log.warning(message, *args)

    def _signing_problem(self, advert: PeerAdvert, owner: str) -> tuple[str, str] | None:
        """An advert whose CURVE key is right but whose signing key is not the trusted one
        (an advert without one is fine: replicas never take the key from adverts)."""
        trusted = self._signing.get(owner)
        if advert.signing_key is None or (
                trusted is not None
                and zmq.utils.z85.encode(trusted).decode("ascii") == advert.signing_key):
            return None
        return ("advert-key-mismatch",
                f"advert of {advert.name!r} carries signing key {advert.signing_key[:8]}..., "
                f"which is not the one trusted for {owner!r}")

    def advert_problem(self, advert: PeerAdvert) -> tuple[str, str] | None:
        """Why a secured node must ignore ``advert``, or None when its key is trusted for
        its name.

        Returns:
            ``(event, detail)``: ``insecure-advert`` (no key: no downgrade),
            ``untrusted-advert`` (the key is not trusted) or ``advert-key-mismatch``
            (the name is bound to another key, or the key to another name).
        """
        if advert.public_key is None:
            return ("insecure-advert",
                    f"advert of {advert.name!r} carries no public key; a secured node only "
                    "connects to secured peers")
        holder = self._by_key.get(advert.public_key)
        owner = key_name(advert.name)  # a seat of the human holds porter-ui's key
        if holder == owner:
            return self._signing_problem(advert, owner)
        expected = self._by_name.get(owner)
        if holder is None and expected is None:
            return ("untrusted-advert",
                    f"advert of {advert.name!r} carries a key that is not trusted "
                    f"({advert.public_key[:8]}...)")
        return ("advert-key-mismatch",
                f"advert of {advert.name!r} carries key {advert.public_key[:8]}..., which "
                + (f"belongs to {holder!r}" if holder else
                   f"is not the key trusted for {advert.name!r}"))


class RecordSigner:
    """Signs this node's knowledge records with its Ed25519 key.

    Args:
        identity: the node's identity; it must hold a signing key.

    Raises:
        SecurityError: the identity has no signing key (a key pair made before they
            existed): the message says how to add one.
    """

    def __init__(self, identity: Identity) -> None:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        if identity.signing_secret is None:
            name = identity.name or "NAME"
            raise SecurityError(
                f"the key {identity.path} has no signing key, so this node cannot sign its "
                "knowledge records and a secured mesh would refuse them; run 'porter-mesh "
                f"keygen {name} --dir {identity.path.parent} --add-signing-key' and trust "
                f"the rewritten {name}{PUBLIC_SUFFIX} again on every machine"
            )
        self._key = Ed25519PrivateKey.from_private_bytes(identity.signing_secret)

    def __call__(self, data: bytes) -> bytes:
        """The 64-byte signature of ``data``."""
        return self._key.sign(data)


class RecordVerifier:
    """Checks record signatures against the signing keys of a :class:`TrustStore`.

    A record by ``origin`` must be signed with the key trusted for ``key_name(origin)``
    (the human's seats sign with the key trusted as ``porter-ui``). Key objects are kept
    until the trusted directory changes. One call checks one signature (some 100-200 us
    with cryptography); the shard calls it once per run of an author's chained records,
    not once per record (see docs/security.md).

    Args:
        store: the trusted directory (the node keeps it refreshed).
    """

    #: Why a signature is refused, as returned by :meth:`__call__`.
    UNSIGNED: Final = "unsigned"
    UNKNOWN_SIGNER: Final = "unknown-signer"
    BAD_SIGNATURE: Final = "bad-signature"

    def __init__(self, store: TrustStore) -> None:
        self.store = store
        self._generation = -1
        self._keys: dict[str, Any] = {}

    def __call__(self, origin: str, data: bytes, sig: bytes | None) -> str | None:
        """Check one signature.

        Args:
            origin: the record's author.
            data: the signed bytes (``record_signing_bytes``).
            sig: the signature the record carries, if any.

        Returns:
            ``None`` when it is good, else the reason: :attr:`UNSIGNED`,
            :attr:`UNKNOWN_SIGNER` (no signing key is trusted for that name) or
            :attr:`BAD_SIGNATURE`.
        """
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        if sig is None:
            return self.UNSIGNED
        if self._generation != self.store.generation:
            self._keys.clear()
            self._generation = self.store.generation
        name = key_name(origin)
        key = self._keys.get(name)
        if key is None:
            raw = self.store.signing_key_for(name)
            if raw is None:
                return self.UNKNOWN_SIGNER
            key = self._keys[name] = Ed25519PublicKey.from_public_bytes(raw)
        try:
            key.verify(sig, data)
        except InvalidSignature:
            return self.BAD_SIGNATURE
        return None


class AuditLog:
    """Security events: a JSON-lines file, a counter per event, a warning the first time.

    Args:
        path: the file to append to, or None to only count and log.
        node: this node's name (written on every line).
        counters: where ``audit.<event>`` is counted.
    """

    def __init__(self, path: pathlib.Path | None, node: str,
                 counters: collections.Counter[str]) -> None:
        self.path = path
        self.node = node
        self._counters = counters
        self._seen: collections.Counter[tuple[str, str]] = collections.Counter()
        self._fd: int | None = None
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                # O_APPEND: each line lands whole at the end, even with several writers.
                self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            except OSError as exc:
                raise SecurityError(f"cannot open the audit log {path}: {exc}") from None

    def record(self, event: str, detail: str, *, peer: str | None = None,
               key: str | None = None, address: str | None = None) -> None:
        """Count ``event`` and, unless it repeats too often, write it down.

        Args:
            event: a short tag (``untrusted-key``, ``spoofed-actor``...).
            detail: what happened, in words.
            peer: the agent concerned (authenticated or claimed), when known.
            key: the Z85 public key concerned, when known.
            address: the remote address, when known.
        """
        self._counters["audit." + event] += 1
        subject = (event, peer or key or address or "?")
        seen = self._seen[subject]
        if seen >= _AUDIT_REPEATS or (not seen and len(self._seen) >= _AUDIT_SUBJECTS):
            return
        self._seen[subject] = seen + 1
        if not seen:
            log.warning("security: %s (%s)", detail, event)
        if self._fd is None:
            return
        line = orjson.dumps({
            "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds"),
            "node": self.node, "event": event, "peer": peer, "key": key,
            "address": address, "detail": detail,
            "repeat": seen + 1,
        }) + b"\n"
        try:
            os.write(self._fd, line)
        except OSError as exc:
            log.error("cannot write the audit log %s: %s", self.path, exc)

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class MeshAuthenticator(Authenticator):
    """pyzmq's ZAP logic, driven by the node's event loop, asking a :class:`TrustStore`.

    pyzmq keeps the ZAP protocol in :class:`zmq.auth.base.Authenticator` and drives it
    from its asyncio and thread authenticators; this is one more thin driver. The node
    watches :attr:`zap_socket` like its other sockets and calls :meth:`answer_pending`
    when it is readable, so that opening and closing the ZAP socket follow the node's
    own socket life cycle (pyzmq's asyncio driver polls through a wrapper whose clean-up
    runs an iteration after ``stop``, by which time a new socket may have taken the
    descriptor number). The credentials callback is synchronous, so pyzmq's handler
    coroutine never suspends and is run to completion at once.

    The User-Id of an accepted connection is the agent name its key is bound to.

    Args:
        context: the node's ZeroMQ context.
        store: the trusted keys.
        audit: where refusals are recorded.
        domain: the ZAP domain (the mesh name) the node's server sockets use.
    """

    def __init__(self, context: zmq.Context[Any], store: TrustStore, audit: AuditLog,
                 domain: str) -> None:
        super().__init__(context, log=logging.getLogger("porter_mesh.security.zap"))
        self.store = store
        self.audit = audit
        self._address = ""
        self.configure_curve_callback(domain, credentials_provider=self)

    def answer_pending(self, limit: int = 256) -> bool:
        """Answer the ZAP requests waiting on :attr:`zap_socket`.

        Returns:
            True when ``limit`` requests were answered and more may be waiting.
        """
        sock = self.zap_socket
        for _ in range(limit):
            if sock is None or sock.closed:
                return False
            try:
                msg = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return False
            self._address = msg[3].decode("utf-8", "replace") if len(msg) > 3 else ""
            step = self.handle_zap_message(msg)
            try:
                step.send(None)
            except StopIteration:
                continue
            step.close()  # it waited on something: only an awaitable callback could
            raise RuntimeError("the ZAP handler suspended; its credentials check must be "
                               "synchronous")
        return True

    def callback(self, domain: str, key: bytes) -> bool:
        """The credentials check: is ``key`` (Z85) in the trusted directory now?"""
        self.store.refresh()
        text = key.decode("ascii", "replace")
        if self.store.name_for(text) is not None:
            return True
        self.audit.record("untrusted-key",
                          f"refused a connection from {self._address or 'an unknown address'}"
                          f" with a key that is not trusted ({text[:8]}...)",
                          key=text, address=self._address or None)
        return False

    def curve_user_id(self, client_public_key: bytes) -> str:
        """The agent name bound to the client's key (the connection's User-Id)."""
        key = zmq.utils.z85.encode(client_public_key).decode("ascii")
        return self.store.name_for(key) or ""


@dataclass
class MeshSecurity:
    """Everything a secured node needs: its identity, the trusted keys, the audit log.

    Build it with :meth:`load`; call :meth:`start` before binding any socket and
    :meth:`stop` after closing them.
    """

    identity: Identity
    store: TrustStore
    audit: AuditLog
    domain: str
    authenticator: MeshAuthenticator | None = None

    @classmethod
    def load(cls, *, name: str, mesh: str, key_file: pathlib.Path,
             trusted_dir: pathlib.Path, audit_path: pathlib.Path | None,
             counters: collections.Counter[str], observer: bool = False) -> MeshSecurity:
        """Load the node's key and the mesh's trusted directory.

        Raises:
            SecurityError: the key cannot be used (see :func:`load_identity`), it was made
                for another agent, or the trusted directory does not exist.
        """
        identity = load_identity(key_file)
        owner = key_name(name)
        if not observer and identity.name is not None and identity.name != owner:
            raise SecurityError(
                f"the key {key_file} was made for {identity.name!r}, not {name!r}; run this "
                f"agent as {identity.name!r} or make it a key with 'porter-mesh keygen {name}'"
            )
        if not trusted_dir.is_dir():
            raise SecurityError(
                f"the trusted directory {trusted_dir} does not exist; add the mesh's public "
                f"keys with 'porter-mesh trust FILE --mesh {mesh}' (see docs/security.md)"
            )
        store = TrustStore(trusted_dir)
        store.refresh()
        bound = store.name_for(identity.public_key)
        if bound is None:
            log.warning("this node's own key is not in %s: peers that share that directory "
                        "will refuse it", trusted_dir)
        elif bound != owner and not observer:
            raise SecurityError(
                f"{trusted_dir} trusts this node's key as {bound!r}, not {name!r}; an agent "
                "can only speak under the name its key is bound to"
            )
        return cls(identity, store, AuditLog(audit_path, name, counters), mesh)

    def start(self, context: zmq.Context[Any]) -> zmq.Socket[Any]:
        """Bind the ZAP handler's socket (before any server socket binds).

        Returns:
            The ZAP socket; the caller watches it and calls
            ``authenticator.answer_pending()`` when it is readable.
        """
        self.authenticator = MeshAuthenticator(context, self.store, self.audit, self.domain)
        self.authenticator.start()
        return self.authenticator.zap_socket

    def stop(self) -> None:
        """Stop the authenticator and close the audit log (after the sockets closed)."""
        if self.authenticator is not None:
            self.authenticator.stop()
            self.authenticator = None
        self.audit.close()

    def serve(self, sock: zmq.Socket[Any]) -> None:
        """Make ``sock`` a CURVE server that asks ZAP about every client."""
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.identity.secret_key)
        sock.setsockopt(zmq.ZAP_DOMAIN, self.domain.encode())
        # Without it libzmq lets clients in when no ZAP handler answers.
        with contextlib.suppress(AttributeError, zmq.ZMQError):
            sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)

    def client(self, sock: zmq.Socket[Any], server_key: str) -> None:
        """Make ``sock`` a CURVE client of the server holding ``server_key``."""
        sock.setsockopt(zmq.CURVE_SERVERKEY, server_key.encode("ascii"))
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.identity.public_key.encode("ascii"))
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.identity.secret_key)

