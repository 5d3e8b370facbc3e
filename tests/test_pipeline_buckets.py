"""The same pipeline against a real GCS emulator (gcsfs) and a local S3 server (s3fs)."""

from __future__ import annotations

import io
import json

import fsspec
import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from maskray.operators import storage
from maskray.pipeline.cli import main
from tests import images

pytestmark = pytest.mark.usefixtures("ray_local")


def upload_catalog(fs, root: str) -> dict[str, bytes]:
    files = {p.name: p.read_bytes() for p in images.PHOTOS[:3]}
    files["sub/dir/rotated.jpg"] = images.exif_rotated_jpeg()
    files["../escape.jpg"] = (images.SAMPLES / "coffee.jpg").read_bytes()  # an object name GCS allows
    files["bad/truncated.jpg"] = images.bad_inputs()["bad/truncated.jpg"][0]
    for key, data in files.items():
        fs.pipe_file(f"{root}/{key}", data)
    return files


def check_run(fs, scheme: str, bucket: str, files: dict[str, bytes], code: int) -> None:
    assert code == 3
    summary = json.loads(fs.cat_file(f"{bucket}/out/_summary.json"))
    assert summary["inputs"] == len(files) and summary["failed"] == 1 and summary["ok"] == len(files) - 1
    parts = fs.find(f"{bucket}/out/_manifest/{summary['run_id']}")
    rows = [r for p in parts if p.endswith(".parquet") for r in pq.read_table(io.BytesIO(fs.cat_file(p))).to_pylist()]
    assert len(rows) == len(files)
    for row in rows:
        assert row["source"].startswith(f"{scheme}://{bucket}/in/")
        if row["status"] == "ok":
            assert row["output"].startswith(f"{scheme}://{bucket}/out/masks/")
            mask = Image.open(io.BytesIO(fs.cat_file(storage.strip_protocol(row["output"]))))
            assert mask.mode == "L" and mask.size == (row["width"], row["height"])
            assert 0 < (np.asarray(mask) >= 128).mean() < 1
    written = fs.find(f"{bucket}/out")
    assert all(p.startswith(f"{bucket}/out/") for p in written)
    # The object named "in/../escape.jpg" got an escaped, contained key.
    assert f"{bucket}/out/masks/%2E%2E/escape.jpg.png" in written
    # Nothing new under the input prefix.
    assert sorted(fs.find(f"{bucket}/in")) == sorted(f"{bucket}/in/{k}" for k in files)


def test_gcs_emulator_end_to_end(gcs_server, bucket_name):
    fs = storage.filesystem("gs://x")
    fs.mkdir(bucket_name)
    files = upload_catalog(fs, f"{bucket_name}/in")
    code = main(["run", "--input", f"gs://{bucket_name}/in/", "--output", f"gs://{bucket_name}/out/", "--no-progress"])
    check_run(fs, "gs", bucket_name, files, code)
    # Resume: the same command skips every ok input.
    assert (
        main(["run", "--input", f"gs://{bucket_name}/in", "--output", f"gs://{bucket_name}/out", "--no-progress"]) == 3
    )
    summary = json.loads(fs.cat_file(f"{bucket_name}/out/_summary.json"))
    assert summary["skipped"] == len(files) - 1 and summary["ok"] == 0


def test_gcs_list_input_needs_no_listing(gcs_server, bucket_name):
    fs = storage.filesystem("gs://x")
    fs.mkdir(bucket_name)
    files = upload_catalog(fs, f"{bucket_name}/in")
    listing = "\n".join(f"gs://{bucket_name}/in/{k}" for k in files if "truncated" not in k)
    fs.pipe_file(f"{bucket_name}/lists/todo.txt", listing.encode())
    code = main(
        ["run", "--input", f"gs://{bucket_name}/lists/todo.txt", "--output", f"gs://{bucket_name}/o2", "--no-progress"]
    )
    assert code == 0
    assert fs.exists(f"{bucket_name}/o2/masks/gs/{bucket_name}/in/sub/dir/rotated.jpg.png")


def test_gcs_missing_bucket_fails_fast(gcs_server, capsys):
    code = main(["run", "--input", "gs://no-such-bucket-here/in", "--output", "gs://no-such-bucket-here/out"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "gs://no-such-bucket-here" in err


def test_s3_end_to_end(s3_server, bucket_name, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.url)
    fs = fsspec.filesystem("s3", endpoint_url=s3_server.url)
    fs.mkdir(bucket_name)
    files = upload_catalog(fs, f"{bucket_name}/in")
    code = main(
        [
            "run",
            "--input",
            f"s3://{bucket_name}/in",
            "--output",
            f"s3://{bucket_name}/out",
            "--no-progress",
            "--endpoint-url",
            s3_server.url,
        ]
    )
    check_run(fs, "s3", bucket_name, files, code)


def test_fetches_and_writes_overlap_when_each_request_is_slow(gcs_server, bucket_name):
    """Through a proxy that adds 50 ms to every request, a run keeps several fetches and writes
    in flight at once; with --io-threads 1 it makes one data request at a time per task (the lease
    heartbeat and the manifest are counted apart, as ``record``)."""
    from bench.latency_proxy import LatencyProxy

    fs = storage.filesystem("gs://x")
    fs.mkdir(bucket_name)
    photo = (images.SAMPLES / "chelsea.jpg").read_bytes()
    fs.pipe({f"{bucket_name}/in/{i:02d}.jpg": photo for i in range(32)})
    proxy = LatencyProxy(gcs_server.url, delay_s=0.05)
    try:
        peaks = {}
        for threads in ("1", "16"):
            proxy.reset()
            code = main(
                [
                    "run",
                    "--input",
                    f"gs://{bucket_name}/in",
                    "--output",
                    f"gs://{bucket_name}/out{threads}",
                    "--no-progress",
                    "--io-threads",
                    threads,
                    "--endpoint-url",
                    proxy.url,
                ]
            )
            assert code == 0
            peaks[threads] = dict(proxy.peak)
    finally:
        proxy.stop()
    assert peaks["1"]["get"] == 1 and peaks["1"]["write"] <= 2
    assert peaks["16"]["get"] >= 8 and peaks["16"]["write"] >= 3, peaks
