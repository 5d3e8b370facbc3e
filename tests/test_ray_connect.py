"""Ray Data and the graph import while Ray starts, and a task worker warms up while the plan runs;
nothing of that may hide an import error."""

from __future__ import annotations

import importlib
import os
import sys
import threading

import pytest

from maskray.pipeline import ray_connect


def test_the_modules_a_run_needs_import_in_the_background():
    """A renamed module would make the overlap a silent no-op: each one must be importable."""
    ray_connect.import_in_background(ray_connect.RUN_MODULES).join(timeout=120)
    assert all(name in sys.modules for name in ray_connect.RUN_MODULES)


def test_a_module_that_fails_is_left_to_the_callers_own_import(tmp_path, monkeypatch):
    (tmp_path / "mr_probe_ok.py").write_text("LOADED = True\n")
    (tmp_path / "mr_probe_broken.py").write_text("raise RuntimeError('broken on purpose')\n")
    (tmp_path / "mr_probe_after.py").write_text("LOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("mr_probe_ok", "mr_probe_broken", "mr_probe_after"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    uncaught: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: uncaught.append(args.exc_value))

    ray_connect.import_in_background(("mr_probe_ok", "mr_probe_broken", "mr_probe_after")).join(timeout=30)

    assert sys.modules["mr_probe_ok"].LOADED and not uncaught
    # The rest is left as well: the caller imports them in order and meets the error first.
    assert "mr_probe_broken" not in sys.modules and "mr_probe_after" not in sys.modules
    with pytest.raises(RuntimeError, match="broken on purpose"):
        importlib.import_module("mr_probe_broken")


def test_the_warm_worker_holds_what_the_graph_tasks_import(ray_local):
    """A renamed module would leave the warm worker cold (a silent no-op): it must hold each one."""
    pid, held = ray_local.get(ray_connect.warm_task_worker(), timeout=120)
    assert pid != os.getpid() and held == list(ray_connect.TASK_MODULES)
