"""CORS (vLLM's --allowed-origins and peers) on a real server, and `graphllm serve` over HTTPS (--ssl-keyfile,
--ssl-certfile) with the openai client trusting a certificate made here."""

import datetime
import ssl
import subprocess
import sys
import time

import httpx2 as httpx
import openai
import pytest

from graphllm.cli.serve import json_list, ssl_files
from tests.server.conftest import API_KEY, free_port, model_dir, start  # noqa: F401  (model_dir: a fixture)

PREFLIGHT = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization,content-type"}


def test_browsers_preflight_and_call_the_api_by_default(request, engine):
    """vLLM's default: every origin. A preflight carries no API key and is answered; the call itself still needs it."""
    running = start(request, engine)
    pre = httpx.options(running.base_url + "/v1/chat/completions", headers=PREFLIGHT, timeout=10)
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "*"
    assert "POST" in pre.headers["access-control-allow-methods"]
    models = httpx.get(running.base_url + "/v1/models", timeout=10,
                       headers={"Origin": "https://app.example", "Authorization": f"Bearer {API_KEY}"})
    assert models.status_code == 200 and models.headers["access-control-allow-origin"] == "*"
    assert httpx.get(running.base_url + "/v1/models", headers={"Origin": "https://app.example"},
                     timeout=10).status_code == 401


def test_only_the_allowed_origins_get_cors_headers(request, engine):
    running = start(request, engine, allowed_origins=("https://app.example",))
    pre = httpx.options(running.base_url + "/v1/chat/completions", headers=PREFLIGHT, timeout=10)
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "https://app.example"
    other = httpx.options(running.base_url + "/v1/chat/completions", timeout=10,
                          headers={**PREFLIGHT, "Origin": "https://evil.example"})
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
    none = start(request, engine, allowed_origins=())
    plain = httpx.get(none.base_url + "/health", headers={"Origin": "https://app.example"}, timeout=10)
    assert plain.status_code == 200 and "access-control-allow-origin" not in plain.headers


def test_cors_and_tls_flags_are_checked_before_the_model_loads(tmp_path):
    assert json_list('["https://a.example", "http://b"]') == ["https://a.example", "http://b"]
    for bad in ("*", '{"a": 1}', "[1]"):
        with pytest.raises(Exception, match="JSON list of strings"):
            json_list(bad)

    class Args:
        ssl_keyfile, ssl_certfile = str(tmp_path / "key.pem"), None
    with pytest.raises(ValueError, match="both --ssl-keyfile and --ssl-certfile"):
        ssl_files(Args)
    Args.ssl_certfile = str(tmp_path / "cert.pem")
    with pytest.raises(ValueError, match="--ssl-keyfile .*key.pem: no such file"):
        ssl_files(Args)


def self_signed(tmp_path) -> tuple[str, str]:
    """A key and a certificate for 127.0.0.1, made with `cryptography`."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    key_file, cert_file = tmp_path / "key.pem", tmp_path / "cert.pem"
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(key_file), str(cert_file)


@pytest.mark.slow  # starts a server process
def test_serve_over_https_answers_the_openai_client(tmp_path, model_dir):  # noqa: F811  (model_dir: a fixture)
    key, cert = self_signed(tmp_path)
    port = free_port()
    argv = [sys.executable, "-m", "graphllm.cli", "serve", "--eager", "--port", str(port), "--log-level", "warning",
            "--ssl-keyfile", key, "--ssl-certfile", cert] + (["--model", model_dir] if model_dir else [])
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        base, deadline = f"https://127.0.0.1:{port}", time.monotonic() + 90
        trusted = ssl.create_default_context(cafile=cert)
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(base + "/health", timeout=1, verify=trusted).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not come up"
            time.sleep(0.2)
        with pytest.raises(httpx.ConnectError):  # a client that does not trust the certificate
            httpx.get(base + "/health", timeout=5)
        with httpx.Client(verify=ssl.create_default_context(cafile=cert)) as http:
            client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=60, http_client=http)
            names = [m.id for m in client.models.list().data]
            reply = client.completions.create(model=names[0], prompt="1 + 1 =", max_tokens=2, temperature=0)
            assert reply.choices[0].finish_reason in ("length", "stop") and reply.usage.completion_tokens >= 1
            # the regression: SIGTERM with this idle keep-alive connection open took the whole 30 s shutdown
            # timeout (asyncio waits for the client's TLS close_notify)
            stopping = time.monotonic()
            proc.terminate()
            assert proc.wait(timeout=30) == 0 and time.monotonic() - stopping < 10
    finally:
        proc.terminate()
        proc.wait(timeout=30)
