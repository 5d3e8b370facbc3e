"""The one run configuration: defaults < YAML file < ``MASKRAY_*`` env < command-line flags.

Validated once at the entry point; errors name the field. The resolved config is written
into the run's summary and beside its manifest.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from maskray.operators.errors import one_line
from maskray.operators.keys import redact_uri_credentials
from maskray.pipeline.weights import U2NETP_MD5, default_model

ENV_PREFIX = "MASKRAY_"


class ConfigError(ValueError):
    """Bad usage or config: the CLI prints the one-line message and exits 2."""


class RunConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: str = Field(description="gs://, s3:// or local prefix, or a .txt/.csv/.parquet list of URIs")
    output: str = Field(description="gs://, s3:// or local prefix for masks, manifest and summary")
    model: str = Field(
        default_factory=default_model,
        description="path or URI of the U2Net-P ONNX file; default: the user cache (fetched on first use)",
    )
    model_md5: str | None = Field(U2NETP_MD5, description="expected md5 of the model; null skips the check")
    format: Literal["mask", "cutout", "both"] = "mask"
    bgcolor: tuple[int, int, int, int] | None = None
    post_process_mask: bool = False
    overwrite: bool = False
    allow_local_sources: bool = Field(False, description="a list read from a bucket may name local paths")
    force: bool = Field(False, description="take over the output's lease even if another run holds it")

    pool_size: int | None = Field(None, ge=1, description="inference actors; default: the cluster's CPUs")
    cpus_per_actor: float = Field(0.75, gt=0, le=64)
    intra_op_threads: int = Field(1, ge=1, le=256)
    inter_op_threads: int = Field(1, ge=1, le=256)
    graph_optimization: Literal["disable", "basic", "extended", "all"] = "all"
    batch_size: int = Field(
        None,
        ge=1,
        le=4096,
        validate_default=False,  # type: ignore[assignment]
        description="images per inference call; default 4 on CPU, 64 on CUDA",
    )
    engine: Literal["auto", "ort", "openvino", "torch"] = Field(
        "auto", description="inference engine; auto: the fastest installed one whose masks agree with ort's"
    )
    precision: Literal["fp32", "bf16"] = Field("fp32", description="bf16: CPUs with avx512_bf16/amx_bf16 only")
    device: Literal["cpu", "cuda"] = Field("cpu", description="cuda: the inference pool runs on GPUs")
    gpus_per_actor: float = Field(0.5, gt=0, le=8, description="GPU share of each inference actor (cuda)")
    decode_cpus: float = Field(0.25, gt=0, le=8, description="CPU reservation of each decode task")
    write_cpus: float = Field(0.25, gt=0, le=8, description="CPU reservation of each encode/write task")
    max_pixels: int = Field(64_000_000, ge=1)
    max_bytes: int = Field(256 * 1024 * 1024, ge=1, description="refuse larger files before fetching")
    png_level: int = Field(1, ge=0, le=9)
    mask_resize: Literal["cubic", "lanczos"] = Field(
        "cubic", description="mask upscale: cubic (fast, within the agreement gate) or lanczos (rembg's exact path)"
    )
    fast_decode: bool = Field(
        False,
        description="decode JPEGs at a reduced DCT scale for the model (outside "
        "the agreement gate: min IoU 0.96 on one 12 MP photo)",
    )
    io_threads: int = Field(16, ge=1, le=256, description="concurrent storage requests per worker process")

    address: str | None = Field(None, description="Ray address; default RAY_ADDRESS or a local Ray")
    num_cpus: int | None = Field(None, ge=1, description="CPUs of a locally started Ray")
    storage_options: dict[str, Any] = Field(default_factory=dict, description="passed to fsspec")
    run_id: str | None = None
    progress: bool = True

    @field_validator("input", "output", "model")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v or not v.strip():
            raise ValueError("must not be empty")
        return v.strip()

    @field_validator("model_md5", mode="before")
    @classmethod
    def _md5_off(cls, v: Any) -> Any:
        return None if isinstance(v, str) and v.strip().lower() in ("", "none", "null", "off") else v

    @field_validator("bgcolor", mode="before")
    @classmethod
    def _parse_bgcolor(cls, v: Any) -> Any:
        if isinstance(v, str):
            parts = [p.strip() for p in v.split(",")]
            if len(parts) != 4:
                raise ValueError("expected R,G,B,A")
            return tuple(int(p) for p in parts)
        return v

    @field_validator("bgcolor")
    @classmethod
    def _bgcolor_range(cls, v: tuple[int, int, int, int] | None) -> Any:
        if v is not None and not all(0 <= c <= 255 for c in v):
            raise ValueError("each of R,G,B,A must be 0..255")
        return v

    @model_validator(mode="after")
    def _bgcolor_needs_cutout(self) -> RunConfig:
        if self.bgcolor is not None and self.format == "mask":
            raise ValueError("bgcolor applies to cutouts: use --format cutout or both")
        return self

    @model_validator(mode="after")
    def _device_defaults(self) -> RunConfig:
        if self.batch_size is None:
            # GPUs want large batches (measured on an H200: 44 img/s at 1, ~470 at 128); CPUs small ones.
            self.batch_size = 64 if self.device == "cuda" else 4
        return self

    @property
    def writes_mask(self) -> bool:
        return self.format in ("mask", "both")

    @property
    def writes_cutout(self) -> bool:
        return self.format in ("cutout", "both")


def _env_values(environ: dict[str, str]) -> dict[str, Any]:
    """``MASKRAY_POOL_SIZE=8`` -> {"pool_size": "8"}; pydantic coerces the strings."""
    fields = RunConfig.model_fields
    out: dict[str, Any] = {}
    for key, value in environ.items():
        name = key[len(ENV_PREFIX) :].lower() if key.startswith(ENV_PREFIX) else None
        if name in fields:
            out[name] = yaml.safe_load(value) if name == "storage_options" else value
    return out


def load_yaml(path: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path}: not valid YAML ({one_line(exc, with_type=False, limit=160)})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping of option: value")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def resolve_config(
    flags: dict[str, Any], config_file: str | None = None, environ: dict[str, str] | None = None
) -> RunConfig:
    """Merge the layers and validate; raises ConfigError with one line naming the field."""
    merged: dict[str, Any] = {}
    if config_file:
        merged.update(load_yaml(config_file))
    merged.update(_env_values(dict(os.environ if environ is None else environ)))
    merged.update({k: v for k, v in flags.items() if v is not None})
    try:
        cfg = RunConfig.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None
    remember_secrets(cfg)
    return cfg


def format_validation_error(exc: ValidationError) -> str:
    errors = exc.errors()
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    first = unknown[0] if unknown else errors[0]
    field = ".".join(str(p) for p in first["loc"]) or "config"
    more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    if unknown:
        return f"config error: unknown option '{field}'{did_you_mean(field)}{more}"
    return f"config error: {field}: {first['msg']}{more}"


def did_you_mean(name: str) -> str:
    match = difflib.get_close_matches(name.replace("-", "_"), list(RunConfig.model_fields), n=1, cutoff=0.6)
    return f" (did you mean '{match[0]}'?)" if match else ""


REDACTED = "<redacted>"
# Values that must never be printed or recorded: storage options' values and URI credentials of
# every config resolved in this process (messages from client libraries may quote them).
_SECRETS: set[str] = set()


def redact_uri(uri: str | None) -> str | None:
    """``s3://KEY:SECRET@bucket/k`` -> ``s3://<redacted>@bucket/k``: no credential in a URI is recorded."""
    if not uri:
        return uri
    return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]*@", rf"\1{REDACTED}@", uri)


def remember_secrets(cfg: RunConfig) -> None:
    def strings(value: Any):
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            for v in value.values():
                yield from strings(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                yield from strings(v)

    _SECRETS.update(v for v in strings(cfg.storage_options) if len(v) >= 4)
    for uri in (cfg.input, cfg.output, cfg.model, cfg.address or ""):
        found = re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://([^/@]+)@", uri)
        if found:
            _SECRETS.update(p for p in re.split(r"[:]", found.group(1)) if len(p) >= 4)


def redact_text(text: str) -> str:
    """A message safe to print: URI credentials and every remembered secret value redacted."""
    text = redact_uri_credentials(text)
    for secret in sorted(_SECRETS, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def recorded_config(cfg: RunConfig) -> dict[str, Any]:
    """The config as written beside the outputs, in the summary and the report: storage options'
    values (keys, secrets, tokens, endpoints) and URI credentials redacted."""
    data = cfg.model_dump(mode="json")
    data["storage_options"] = dict.fromkeys(data.get("storage_options") or {}, REDACTED)
    for key in ("input", "output", "model", "address"):
        data[key] = redact_uri(data.get(key))
    return data


def dump_yaml(cfg: RunConfig) -> str:
    data = {k: v for k, v in recorded_config(cfg).items() if v is not None}
    return yaml.safe_dump(data, sort_keys=False)
