"""Config layering and fail-fast errors: exit 2 with one line, before any work."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from maskray.operators import storage
from maskray.pipeline.cli import main
from maskray.pipeline.config import ConfigError, resolve_config


def test_layers_defaults_file_env_flags(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("input: gs://a/in\noutput: gs://a/out\npool-size: 8\nbatch_size: 2\n")
    cfg = resolve_config({"batch_size": 16}, str(job), environ={"MASKRAY_POOL_SIZE": "3"})
    assert (cfg.input, cfg.pool_size, cfg.batch_size, cfg.cpus_per_actor) == ("gs://a/in", 3, 16, 0.75)


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        ({"pool_size": 0}, "pool_size"),
        ({"cpus_per_actor": -1}, "cpus_per_actor"),
        ({"format": "jpeg"}, "format"),
        ({"bgcolor": "1,2,3"}, "bgcolor"),
        ({"bgcolor": "1,2,3,4"}, "bgcolor applies to cutouts"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_errors_name_the_field(flags, field):
    with pytest.raises(ConfigError) as err:
        resolve_config({"input": "a", "output": "b", **flags}, environ={})
    assert field in str(err.value) and "\n" not in str(err.value)


def test_missing_required_field():
    with pytest.raises(ConfigError, match="output"):
        resolve_config({"input": "x"}, environ={})


def run_cli(args, capsys):
    code = main(args)
    return code, capsys.readouterr().err.strip()


def test_missing_model_exits_2(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    code, err = run_cli(
        [
            "run",
            "--input",
            str(tmp_path / "in"),
            "--output",
            str(tmp_path / "out"),
            "--model",
            str(tmp_path / "nope.onnx"),
        ],
        capsys,
    )
    assert code == 2 and err.count("\n") == 0 and "nope.onnx: not found" in err
    assert not (tmp_path / "out").exists()


def test_wrong_hash_model_exits_2(tmp_path, capsys):
    fake = tmp_path / "u2netp.onnx"
    fake.write_bytes(b"not really a model")
    code, err = run_cli(["run", "--input", str(tmp_path), "--output", "/tmp/never", "--model", str(fake)], capsys)
    assert code == 2 and "does not match expected" in err


def test_unloadable_model_without_hash_check_exits_2(tmp_path, capsys):
    fake = tmp_path / "m.onnx"
    fake.write_bytes(b"garbage")
    (tmp_path / "in").mkdir()
    code, err = run_cli(
        [
            "run",
            "--input",
            str(tmp_path / "in"),
            "--output",
            str(tmp_path / "o"),
            "--model",
            str(fake),
            "--model-md5",
            "none",
        ],
        capsys,
    )
    assert code == 2 and "not a loadable ONNX model" in err


def test_overlapping_prefixes_exit_2(tmp_path, capsys, model_path):
    (tmp_path / "in").mkdir()
    code, err = run_cli(["run", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "in" / "masks")], capsys)
    assert code == 2 and "overlap" in err


def test_missing_input_prefix_exits_2(tmp_path, capsys, model_path):
    code, err = run_cli(["run", "--input", str(tmp_path / "nowhere"), "--output", str(tmp_path / "o")], capsys)
    assert code == 2 and "does not exist" in err


@pytest.mark.slow
def test_unreachable_bucket_exits_2_in_one_line(tmp_path, model_path):
    """A real subprocess against a closed port: the storage client fails, we print one line."""
    env_cmd = [
        sys.executable,
        "-m",
        "maskray.pipeline.cli",
        "run",
        "--input",
        "gs://nobucket/in",
        "--output",
        str(tmp_path / "o"),
        "--endpoint-url",
        "http://127.0.0.1:9",
    ]
    proc = subprocess.run(env_cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("maskray:")]
    assert len(lines) == 1 and "gs://nobucket/in" in lines[0] and "127.0.0.1:9" in lines[0]


def test_custom_endpoints_are_found_and_probed(monkeypatch):
    """Only a user-set endpoint is probed, from the option or the env var each client reads."""
    for name in ("STORAGE_EMULATOR_HOST", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    assert storage.custom_endpoint("gs://b/k") is None and storage.custom_endpoint("/local/k") is None
    assert storage.custom_endpoint("gs://b/k", {"endpoint_url": "http://h:1"}) == "http://h:1"
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "h:2")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://h:3")
    assert (storage.custom_endpoint("gs://b/k"), storage.custom_endpoint("s3://b/k")) == ("h:2", "http://h:3")
    assert storage.custom_endpoint("s3://b/k", {"client_kwargs": {"endpoint_url": "http://h:4"}}) == "http://h:4"
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        storage.check_reachable(f"127.0.0.1:{port}")
    with pytest.raises(ConnectionError, match=f"127.0.0.1:{port}"):
        storage.check_reachable(f"http://127.0.0.1:{port}")


def test_bad_usage_exits_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", "--pool-size", "many"])
    assert exc.value.code == 2


@pytest.mark.parametrize(("key", "hint"), [("inptu", "input"), ("pool-szie", "pool_size"), ("zzz", None)])
def test_an_unknown_option_is_named_with_the_closest_valid_one(tmp_path, key, hint):
    job = tmp_path / "job.yaml"
    job.write_text(f"input: gs://a/in\noutput: gs://a/out\n{key}: 1\n")
    with pytest.raises(ConfigError) as err:
        resolve_config({}, str(job), environ={})
    message = str(err.value)
    assert f"unknown option '{key.replace('-', '_')}'" in message and "\n" not in message
    assert (f"(did you mean '{hint}'?)" in message) if hint else "did you mean" not in message


def test_recorded_config_redacts_storage_options_and_uri_credentials():
    from maskray.pipeline.config import dump_yaml, recorded_config

    cfg = resolve_config(
        {
            "input": "s3://AKIAKEY:s3cr3t@bkt/in",
            "output": "gs://b/out",
            "storage_options": {"key": "AKIAKEY", "secret": "s3cr3t", "token": "tok"},
        },
        environ={},
    )
    data = recorded_config(cfg)
    text = dump_yaml(cfg) + str(data)
    assert "s3cr3t" not in text and "AKIAKEY" not in text and "tok'" not in text
    assert data["input"] == "s3://<redacted>@bkt/in" and data["output"] == "gs://b/out"
    assert data["storage_options"] == {"key": "<redacted>", "secret": "<redacted>", "token": "<redacted>"}
    assert cfg.storage_options["secret"] == "s3cr3t"  # the run itself still has them
